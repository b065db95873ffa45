// The etcd control plane against a real etcd: two or three "routers" (control plane
// instances, one of them in a helper process) sharing one etcd started by the test.
#include <atomic>
#include <thread>

#include "etcd_fixture.h"
#include "log_capture.h"

namespace ff::cp {
namespace {

TEST_F(EtcdTest, TwoRoutersSeeEachOthersNodesAndPods) {
  auto a = Router(kA, {"10.244.1.5", "10.244.1.6"});
  auto b = Router(kB, {"10.244.2.5"});
  ASSERT_TRUE(a && b);
  EXPECT_TRUE(WaitFor([&] { return Sees(*a, "10.244.2.5", kB); }, 1s));
  EXPECT_TRUE(
      WaitFor([&] { return Sees(*b, "10.244.1.5", kA) && Sees(*b, "10.244.1.6", kA); }, 1s));
  EXPECT_TRUE(Sees(*a, "10.244.1.5", kA));  // own pods resolve to self
  EXPECT_TRUE(Unknown(*a, "10.244.9.9"));
  EXPECT_EQ(a->Nodes(), std::vector<Endpoint>{kB});
  EXPECT_EQ(b->Nodes(), std::vector<Endpoint>{kA});
}

TEST_F(EtcdTest, KeyLayoutAndLeases) {
  auto a = Router(kA, {"10.244.1.5"});
  ASSERT_TRUE(a);
  EXPECT_EQ(etcd_.Dump("/freeflow/v2/"),
            "/freeflow/v2/nodes/node-a/endpoint={\"address\":\"127.0.0.1\",\"port\":7471} leased\n"
            "/freeflow/v2/nodes/node-a/pods/10.244.1.5= leased\n");
}

TEST_F(EtcdTest, PublishAndWithdrawAfterStartAreSeenWithinOneSecond) {
  auto a = Router(kA);
  auto b = Router(kB);
  ASSERT_TRUE(a && b);
  std::atomic<int> changes{0};
  // OnChange must be set before Start, so use a third router to observe callbacks.
  auto c = Make(kC);
  c->OnChange([&] { ++changes; });
  std::string error;
  ASSERT_TRUE(c->Start(&error)) << error;
  ASSERT_TRUE(WaitFor([&] { return c->Healthy(); }, 5s));
  const int before = changes;

  auto t0 = Clock::now();
  b->Publish(Ip("10.244.2.7"));
  EXPECT_TRUE(Sees(*b, "10.244.2.7", kB));  // immediately, locally
  EXPECT_TRUE(WaitFor([&] { return Sees(*a, "10.244.2.7", kB); }, 1s));
  EXPECT_LT(Clock::now() - t0, 1s);
  EXPECT_TRUE(WaitFor([&] { return changes > before; }, 1s));

  t0 = Clock::now();
  b->Withdraw(Ip("10.244.2.7"));
  b->Withdraw(Ip("10.244.2.99"));  // never published: no-op
  EXPECT_TRUE(Unknown(*b, "10.244.2.7"));
  EXPECT_TRUE(WaitFor([&] { return Unknown(*a, "10.244.2.7"); }, 1s));
  EXPECT_LT(Clock::now() - t0, 1s);
  EXPECT_EQ(etcd_.Dump("/freeflow/v2/nodes/node-b/pods/"), "");
}

TEST_F(EtcdTest, DestroyingARouterRevokesItsEntries) {
  auto a = Router(kA);
  auto b = Router(kB, {"10.244.2.5"});
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(WaitFor([&] { return Sees(*a, "10.244.2.5", kB); }, 1s));
  const auto t0 = Clock::now();
  b.reset();
  EXPECT_LT(Clock::now() - t0, 1500ms) << "the destructor must be prompt";
  EXPECT_TRUE(WaitFor([&] { return Unknown(*a, "10.244.2.5") && a->Nodes().empty(); }, 1s));
  EXPECT_EQ(
      etcd_.Dump("/freeflow/v2/"),
      "/freeflow/v2/nodes/node-a/endpoint={\"address\":\"127.0.0.1\",\"port\":7471} leased\n");
}

TEST_F(EtcdTest, ACrashedRoutersEntriesExpireWithItsLease) {
  auto a = Router(kA);
  ASSERT_TRUE(a);
  Peer peer("etcd:" + etcd_.url(), 1000, {"10.244.3.5"});
  ASSERT_TRUE(peer.WaitReady(10s));
  ASSERT_TRUE(WaitFor([&] { return Sees(*a, "10.244.3.5", kPeer); }, 1s));
  const auto t0 = Clock::now();
  peer.Kill();
  // Not revoked: still there right after the crash...
  EXPECT_TRUE(Sees(*a, "10.244.3.5", kPeer));
  // ...and gone once the 1 s lease runs out (etcd checks expiry about every 500 ms).
  EXPECT_TRUE(WaitFor([&] { return Unknown(*a, "10.244.3.5") && a->Nodes().empty(); }, 3s));
  EXPECT_GT(Clock::now() - t0, 300ms);
}

TEST_F(EtcdTest, TheLeaseIsKeptAliveBeyondItsTtl) {
  options_.lease_ttl = 1000ms;
  auto a = Router(kA, {"10.244.1.5"});
  auto b = Router(kB);
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(WaitFor([&] { return Sees(*b, "10.244.1.5", kA); }, 1s));
  // Three TTLs (sampled every 50 ms): never gone, never disconnected.
  for (int i = 0; i < 60; ++i) {
    ASSERT_TRUE(Sees(*b, "10.244.1.5", kA)) << "after " << i * 50 << " ms";
    ASSERT_TRUE(a->Healthy() && b->Healthy()) << "after " << i * 50 << " ms";
    std::this_thread::sleep_for(50ms);
  }
}

TEST_F(EtcdTest, ALostLeaseIsReplacedAndEverythingRewritten) {
  options_.lease_ttl = 1000ms;  // refreshed every ~333 ms, so the loss is noticed quickly
  auto a = Router(kA, {"10.244.1.5"});
  std::atomic<int> changes{0};
  auto b = Make(kB);
  b->OnChange([&] { ++changes; });
  std::string error;
  ASSERT_TRUE(b->Start(&error)) << error;
  ASSERT_TRUE(WaitFor([&] { return Sees(*b, "10.244.1.5", kA); }, 2s));
  const int before = changes;
  ASSERT_TRUE(etcd_.RevokeLeaseOf("/freeflow/v2/nodes/node-a/endpoint"));
  // node-a's keys go (b notices through its watch) and come back under a new lease.
  EXPECT_TRUE(WaitFor([&] { return changes >= before + 2; }, 2s));
  EXPECT_TRUE(WaitFor([&] { return Sees(*b, "10.244.1.5", kA) && a->Healthy(); }, 2s));
  EXPECT_EQ(
      etcd_.Dump("/freeflow/v2/"),
      "/freeflow/v2/nodes/node-a/endpoint={\"address\":\"127.0.0.1\",\"port\":7471} leased\n"
      "/freeflow/v2/nodes/node-a/pods/10.244.1.5= leased\n"
      "/freeflow/v2/nodes/node-b/endpoint={\"address\":\"127.0.0.2\",\"port\":7472} leased\n");
}

TEST_F(EtcdTest, ARestartedRouterDeletesItsStalePods) {
  auto a = Router(kA);
  ASSERT_TRUE(a);
  {
    Peer peer("etcd:" + etcd_.url(), 30000, {"10.244.3.5", "10.244.3.6"});
    ASSERT_TRUE(peer.WaitReady(10s));
    ASSERT_TRUE(WaitFor([&] { return Sees(*a, "10.244.3.6", kPeer); }, 1s));
  }  // killed: its lease would last 30 s
  // The same node comes back with only one of the pods.
  auto again = Router(kPeer, {"10.244.3.5"});
  ASSERT_TRUE(again);
  EXPECT_TRUE(WaitFor([&] { return Unknown(*a, "10.244.3.6"); }, 1s));
  EXPECT_TRUE(Sees(*a, "10.244.3.5", kPeer));
}

// Each node writes only its own keys, so two nodes may announce one address: the first
// keeps it (a node cannot take over an address another node serves), until it withdraws.
TEST_F(EtcdTest, AnAddressTwoNodesAnnounceStaysWithTheFirstUntilItWithdraws) {
  auto a = Router(kA, {"10.244.1.5"});
  auto b = Router(kB);
  auto c = Router(kC);
  ASSERT_TRUE(a && b && c);
  ASSERT_TRUE(WaitFor([&] { return Sees(*c, "10.244.1.5", kA); }, 1s));
  b->Publish(Ip("10.244.1.5"));  // the pod moves to node-b before node-a withdraws it
  ASSERT_TRUE(WaitFor([&] { return etcd_.Dump("/freeflow/v2/nodes/node-b/pods/") != ""; }, 1s));
  std::this_thread::sleep_for(200ms);
  EXPECT_TRUE(Sees(*c, "10.244.1.5", kA));
  EXPECT_TRUE(Sees(*b, "10.244.1.5", kB));  // a router's own pods resolve to itself
  a->Withdraw(Ip("10.244.1.5"));            // node-a cleans up late
  EXPECT_TRUE(WaitFor([&] { return Sees(*c, "10.244.1.5", kB); }, 1s));
  EXPECT_TRUE(WaitFor([&] { return Sees(*a, "10.244.1.5", kB); }, 1s));
  // A router that starts now reads both states from etcd and agrees.
  b->Withdraw(Ip("10.244.1.5"));
  ASSERT_TRUE(WaitFor([&] { return Unknown(*c, "10.244.1.5"); }, 1s));
  b->Publish(Ip("10.244.1.5"));
  ASSERT_TRUE(WaitFor([&] { return etcd_.Dump("/freeflow/v2/nodes/node-b/pods/") != ""; }, 1s));
  a->Publish(Ip("10.244.1.5"));
  ASSERT_TRUE(WaitFor([&] { return etcd_.Dump("/freeflow/v2/nodes/node-a/pods/") != ""; }, 1s));
  c.reset();
  c = Router(kC);
  ASSERT_TRUE(c);
  EXPECT_TRUE(Sees(*c, "10.244.1.5", kB));
}

TEST_F(EtcdTest, EtcdOutageKeepsTheCacheAndRecovers) {
  auto a = Router(kA, {"10.244.1.5"});
  auto b = Router(kB, {"10.244.2.5", "10.244.2.6"});
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(WaitFor([&] { return Sees(*a, "10.244.2.6", kB); }, 1s));

  etcd_.Stop();
  EXPECT_TRUE(WaitFor([&] { return !a->Healthy() && !b->Healthy(); }, 3s));
  // Existing traffic keeps flowing: the cache still answers.
  EXPECT_TRUE(Sees(*a, "10.244.2.5", kB));
  EXPECT_TRUE(Sees(*b, "10.244.1.5", kA));
  EXPECT_EQ(a->Nodes(), std::vector<Endpoint>{kB});
  // Changes while etcd is down are remembered.
  b->Publish(Ip("10.244.2.7"));
  b->Withdraw(Ip("10.244.2.6"));
  std::this_thread::sleep_for(300ms);  // a few failed reconnection attempts

  std::string error;
  ASSERT_TRUE(etcd_.Start(&error)) << error;
  EXPECT_TRUE(WaitFor([&] { return a->Healthy() && b->Healthy(); }, 5s));
  EXPECT_TRUE(WaitFor([&] { return Sees(*a, "10.244.2.7", kB); }, 2s));
  EXPECT_TRUE(WaitFor([&] { return Unknown(*a, "10.244.2.6"); }, 2s));
  EXPECT_TRUE(Sees(*a, "10.244.2.5", kB));
  // And the watch works again.
  a->Publish(Ip("10.244.1.8"));
  EXPECT_TRUE(WaitFor([&] { return Sees(*b, "10.244.1.8", kA); }, 1s));
}

TEST_F(EtcdTest, TriesEveryEndpointInTurn) {
  const std::string dead = "http://127.0.0.1:" + std::to_string(testing::FreePort());
  auto a = Make(kA, "etcd:" + dead + "," + etcd_.url());
  ASSERT_TRUE(a);
  std::string error;
  ASSERT_TRUE(a->Start(&error)) << error;
  EXPECT_TRUE(WaitFor([&] { return a->Healthy(); }, 3s));
}

// A router given an etcd user on an etcd whose authentication is off works, and warns that
// anyone who reaches etcd can change where pods live.
TEST_F(EtcdTest, AUserOnAnEtcdWithoutAuthenticationIsWarnedAbout) {
  ff::testing::LogCapture log;
  options_.etcd.user = "node-a";
  options_.etcd.password = "secret";
  auto a = Router(kA, {"10.244.1.5"});
  options_.etcd = {};
  auto b = Router(kB);
  ASSERT_TRUE(a && b);
  EXPECT_TRUE(WaitFor([&] { return Sees(*b, "10.244.1.5", kA); }, 1s));
  EXPECT_EQ(log.Count({"has authentication off", "anyone who reaches it"}), 1);
  EXPECT_EQ(log.Count({"authenticates over plaintext http://"}), 1);
}

TEST_F(EtcdTest, CustomPrefixKeepsDeploymentsApart) {
  options_.prefix = "/other/";
  auto a = Router(kA, {"10.244.1.5"});
  options_.prefix = "/freeflow/v2/";
  auto b = Router(kB);
  ASSERT_TRUE(a && b);
  std::this_thread::sleep_for(200ms);
  EXPECT_TRUE(Unknown(*b, "10.244.1.5"));
  EXPECT_TRUE(b->Nodes().empty());
  EXPECT_NE(etcd_.Dump("/other/"), "");
}

}  // namespace
}  // namespace ff::cp
