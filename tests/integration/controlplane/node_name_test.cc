// One router per node name, against a real etcd: a second router with a taken name is
// refused at start and writes nothing; routers starting together elect one; a restart on
// the same address, a crashed holder and an unleased key do not block a start; a router
// whose key another writer takes says so and does not write it back.
#include <atomic>
#include <thread>

#include "etcd_fixture.h"
#include "log_capture.h"

namespace ff::cp {
namespace {

const std::string kNodeA = "/freeflow/v2/nodes/node-a/endpoint";
const std::string kNodeP = "/freeflow/v2/nodes/node-p/endpoint";
constexpr auto npos = std::string::npos;
using ff::testing::LogCapture;

// A 4 s lease the test refreshes every 1.5 s from a thread, as a live router would.
class LiveLease {
 public:
  explicit LiveLease(const EtcdServer& etcd) : etcd_(etcd), id_(etcd.Grant(4)) {
    thread_ = std::thread([this] {
      for (auto next = Clock::now(); !stop_; std::this_thread::sleep_for(20ms)) {
        if (Clock::now() < next) continue;
        etcd_.KeepAlive(id_);
        next = Clock::now() + 1500ms;
      }
    });
  }
  ~LiveLease() { Stop(); }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  int64_t id() const { return id_; }

 private:
  const EtcdServer& etcd_;
  const int64_t id_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

TEST_F(EtcdTest, ARouterWithATakenNameIsRefusedAndWritesNothing) {
  options_.lease_ttl = 5000ms;  // the default
  auto a = Router(kA, {"10.244.1.5"});
  auto b = Router(kB);
  ASSERT_TRUE(a && b);
  const std::string before = etcd_.Dump("/freeflow/v2/");
  const int64_t lease = etcd_.LeaseOf(kNodeA);
  ASSERT_GT(lease, 0);

  auto twin = Make({"node-a", Ip("127.0.0.5"), 7475});
  ASSERT_TRUE(twin);
  twin->Publish(Ip("10.244.7.7"));
  std::string error;
  const auto t0 = Clock::now();
  EXPECT_FALSE(twin->Start(&error));
  // node-a refreshes its 5 s lease every ~1.7 s: seen alive well before the lease ends.
  EXPECT_LT(Clock::now() - t0, 3s);
  EXPECT_NE(error.find("node name \"node-a\" is taken"), npos) << error;
  EXPECT_NE(error.find("a live router at 127.0.0.1:7471"), npos) << error;
  EXPECT_NE(error.find("serves node links on 127.0.0.5:7475"), npos) << error;
  EXPECT_NE(error.find("--node-name"), npos) << error;
  EXPECT_NE(error.find(kNodeA), npos) << error;
  EXPECT_FALSE(twin->Healthy());
  twin.reset();

  // The holder is untouched: same keys, same lease, still connected and resolved.
  EXPECT_EQ(etcd_.Dump("/freeflow/v2/"), before);
  EXPECT_EQ(etcd_.LeaseOf(kNodeA), lease);
  EXPECT_TRUE(a->Healthy());
  EXPECT_TRUE(Sees(*b, "10.244.1.5", kA));
  EXPECT_TRUE(Unknown(*b, "10.244.7.7"));
}

TEST_F(EtcdTest, RoutersStartingTogetherWithOneNameElectExactlyOne) {
  constexpr int kRouters = 4;
  std::vector<std::unique_ptr<ControlPlane>> routers;
  for (int i = 0; i < kRouters; ++i)
    routers.push_back(Make({"node-a", Ip("127.0.0.1") + static_cast<uint32_t>(i), 7471}));
  std::atomic<bool> go{false};
  std::vector<std::string> errors(kRouters);
  std::vector<int> ok(kRouters, 0);
  std::vector<std::thread> threads;
  for (int i = 0; i < kRouters; ++i) {
    threads.emplace_back([&, i] {
      while (!go) std::this_thread::yield();
      ok[i] = routers[i]->Start(&errors[i]) ? 1 : 0;
    });
  }
  go = true;
  for (auto& t : threads) t.join();
  int winners = 0;
  for (int i = 0; i < kRouters; ++i) {
    if (!ok[i]) {
      EXPECT_NE(errors[i].find("is taken"), npos) << errors[i];
      continue;
    }
    ++winners;
    const std::string address = FormatIpv4(Ip("127.0.0.1") + static_cast<uint32_t>(i));
    EXPECT_TRUE(WaitFor([&] { return routers[i]->Healthy(); }, 5s));
    EXPECT_EQ(etcd_.Dump(kNodeA),
              kNodeA + "={\"address\":\"" + address + "\",\"port\":7471} leased\n");
  }
  EXPECT_EQ(winners, 1);
}

TEST_F(EtcdTest, ARestartOnTheSameAddressTakesOverItsCrashedRun) {
  Peer peer("etcd:" + etcd_.url(), 30000, {"10.244.3.5"});
  ASSERT_TRUE(peer.WaitReady(10s));
  const int64_t old_lease = etcd_.LeaseOf(kNodeP);
  ASSERT_GT(old_lease, 0);
  peer.Kill();  // its lease would last 30 s more

  const auto t0 = Clock::now();
  auto again = Router(kPeer, {"10.244.3.5"});
  ASSERT_TRUE(again);
  EXPECT_LT(Clock::now() - t0, 2s) << "the same address must not wait for the old lease";
  const int64_t lease = etcd_.LeaseOf(kNodeP);
  EXPECT_GT(lease, 0);
  EXPECT_NE(lease, old_lease);
}

TEST_F(EtcdTest, ACrashedHolderAtAnotherAddressIsWaitedOut) {
  Peer peer("etcd:" + etcd_.url(), 1000, {"10.244.3.5"});
  ASSERT_TRUE(peer.WaitReady(10s));
  peer.Kill();  // its 1 s lease is not refreshed any more

  const Endpoint moved{"node-p", Ip("127.0.0.8"), 7478};
  auto cp = Make(moved);
  ASSERT_TRUE(cp);
  std::string error;
  EXPECT_TRUE(cp->Start(&error)) << error;
  EXPECT_TRUE(WaitFor([&] { return cp->Healthy(); }, 5s));
  EXPECT_EQ(etcd_.Dump(kNodeP), kNodeP + "={\"address\":\"127.0.0.8\",\"port\":7478} leased\n");
}

TEST_F(EtcdTest, AnUnleasedNodeKeyIsTakenWithAWarning) {
  LogCapture log;
  ASSERT_TRUE(etcd_.Put(kNodeA, R"({"address":"127.0.0.5","port":7475})", 0));
  auto a = Router(kA);
  ASSERT_TRUE(a);
  EXPECT_EQ(etcd_.Dump(kNodeA), kNodeA + "={\"address\":\"127.0.0.1\",\"port\":7471} leased\n");
  EXPECT_EQ(log.Count({"has no lease", kNodeA.c_str()}), 1);
}

TEST_F(EtcdTest, AKeyTakenByAnotherWriterIsReportedAndNotWrittenBack) {
  LogCapture log;
  auto a = Router(kA, {"10.244.1.5"});
  ASSERT_TRUE(a);
  LiveLease intruder(etcd_);
  ASSERT_GT(intruder.id(), 0);
  const std::string taken = R"({"address":"127.0.0.5","port":7475})";
  ASSERT_TRUE(etcd_.Put(kNodeA, taken, intruder.id()));

  // node-a says so, gives up its lease (its pods would lead to the intruder) and does not
  // write its key back while the intruder's lease lives.
  EXPECT_TRUE(WaitFor([&] { return log.Count({"another writer took", "node-a"}) == 1; }, 2s));
  EXPECT_TRUE(WaitFor(
      [&] {
        return log.Count({"is taken", "127.0.0.5:7475", "127.0.0.1:7471"}) == 1;
      },
      5s));
  EXPECT_FALSE(a->Healthy());
  EXPECT_EQ(etcd_.Dump("/freeflow/v2/nodes/node-a/pods/"), "");
  for (int i = 0; i < 15; ++i) {
    ASSERT_EQ(etcd_.LeaseOf(kNodeA), intruder.id()) << "after " << i * 100 << " ms";
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_EQ(log.Count({"is taken"}), 1) << "repeated within a minute";

  // The intruder goes: node-a takes its name back and announces its pods again.
  intruder.Stop();
  ASSERT_TRUE(etcd_.RevokeLeaseOf(kNodeA));
  EXPECT_TRUE(WaitFor([&] { return a->Healthy(); }, 5s));
  EXPECT_EQ(etcd_.Dump("/freeflow/v2/"),
            "/freeflow/v2/nodes/node-a/endpoint={\"address\":\"127.0.0.1\",\"port\":7471} leased\n"
            "/freeflow/v2/nodes/node-a/pods/10.244.1.5= leased\n");
}

TEST_F(EtcdTest, ASecondRouterAtTheSameAddressWinsAndTheFirstGivesWay) {
  LogCapture log;
  auto first = Router(kA);
  ASSERT_TRUE(first);
  auto second = Router(kA);  // e.g. a duplicate in another network namespace
  ASSERT_TRUE(second);
  const int64_t lease = etcd_.LeaseOf(kNodeA);
  EXPECT_TRUE(WaitFor([&] { return log.Count({"is taken", "the same address"}) == 1; }, 5s));
  for (int i = 0; i < 10; ++i) {
    ASSERT_EQ(etcd_.LeaseOf(kNodeA), lease) << "after " << i * 100 << " ms";
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_TRUE(second->Healthy());
  EXPECT_FALSE(first->Healthy());
}

}  // namespace
}  // namespace ff::cp
