// The etcd control plane against a real etcd: two or three "routers" (control plane
// instances, one of them in a helper process) sharing one etcd started by the test.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <thread>

#include "etcd_server.h"
#include "freeflow/controlplane.h"
#include "freeflow/ipv4.h"

namespace ff::cp {
namespace {

using namespace std::chrono_literals;
using testing::EtcdServer;
using Clock = std::chrono::steady_clock;

uint32_t Ip(const char* text) { return *ParseIpv4(text); }

const Endpoint kA{"node-a", 0x7f000001, 7471};
const Endpoint kB{"node-b", 0x7f000002, 7472};
const Endpoint kC{"node-c", 0x7f000003, 7473};
const Endpoint kPeer{"node-p", 0x7f000009, 7479};  // what controlplane_etcd_peer announces

template <typename F>
bool WaitFor(F done, std::chrono::milliseconds limit) {
  for (auto end = Clock::now() + limit; Clock::now() < end; std::this_thread::sleep_for(5ms))
    if (done()) return true;
  return done();
}

// The helper binary in a child process, with pipes on its stdin and stdout.
class Peer {
 public:
  Peer(const std::string& spec, int ttl_ms, const std::vector<std::string>& ips) {
    int in[2], out[2];
    if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) return;
    std::vector<std::string> args = {FFCP_PEER, spec, kPeer.node, std::to_string(ttl_ms)};
    args.insert(args.end(), ips.begin(), ips.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, in[0], 0);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    if (::posix_spawn(&pid_, FFCP_PEER, &actions, nullptr, argv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&actions);
    ::close(in[0]);
    ::close(out[1]);
    stdin_ = in[1];
    stdout_ = out[0];
  }
  ~Peer() {
    Kill();
    if (stdin_ >= 0) ::close(stdin_);
    if (stdout_ >= 0) ::close(stdout_);
  }

  // Waits (bounded) for the helper's "ready" line.
  bool WaitReady(std::chrono::milliseconds limit) {
    std::string seen;
    for (auto end = Clock::now() + limit; Clock::now() < end;) {
      pollfd pfd{stdout_, POLLIN, 0};
      if (::poll(&pfd, 1, 50) <= 0) continue;
      char buf[64];
      const ssize_t n = ::read(stdout_, buf, sizeof(buf));
      if (n <= 0) return false;
      seen.append(buf, static_cast<size_t>(n));
      if (seen.find("ready\n") != std::string::npos) return true;
    }
    return false;
  }

  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
  int stdin_ = -1, stdout_ = -1;
};

class EtcdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // scripts/install-deps.sh installs etcd-server: a missing binary is a failed install
    // step, not a reason to pass without testing.
    ASSERT_FALSE(EtcdServer::Binary().empty())
        << "etcd is not installed (run scripts/install-deps.sh, or set FF_ETCD)";
    std::string error;
    ASSERT_TRUE(etcd_.Start(&error)) << error;
    options_.lease_ttl = 2000ms;
    options_.backoff_min = 20ms;
    options_.backoff_max = 300ms;
    options_.rpc_timeout = 1000ms;
  }

  std::unique_ptr<ControlPlane> Make(const Endpoint& self, std::string spec = {}) {
    std::string error;
    auto cp = MakeControlPlane(spec.empty() ? "etcd:" + etcd_.url() : spec, self, options_, &error);
    EXPECT_NE(cp, nullptr) << error;
    return cp;
  }

  // Makes, starts and waits until connected.
  std::unique_ptr<ControlPlane> Router(const Endpoint& self,
                                       std::initializer_list<const char*> ips = {}) {
    auto cp = Make(self);
    if (!cp) return cp;
    for (const char* ip : ips) cp->Publish(Ip(ip));
    std::string error;
    EXPECT_TRUE(cp->Start(&error)) << error;
    EXPECT_TRUE(WaitFor([&] { return cp->Healthy(); }, 5s)) << self.node << " never connected";
    return cp;
  }

  static bool Sees(const ControlPlane& cp, const char* ip, const Endpoint& where) {
    return cp.Lookup(Ip(ip)) == where;
  }
  static bool Unknown(const ControlPlane& cp, const char* ip) { return !cp.Lookup(Ip(ip)); }

  EtcdServer etcd_;
  Options options_;
};

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
  EXPECT_EQ(etcd_.Dump("/freeflow/v1/"),
            "/freeflow/v1/nodes/node-a={\"address\":\"127.0.0.1\",\"port\":7471} leased\n"
            "/freeflow/v1/pods/10.244.1.5=node-a leased\n");
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
  EXPECT_EQ(etcd_.Dump("/freeflow/v1/pods/"), "");
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
  EXPECT_EQ(etcd_.Dump("/freeflow/v1/"),
            "/freeflow/v1/nodes/node-a={\"address\":\"127.0.0.1\",\"port\":7471} leased\n");
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
  ASSERT_TRUE(etcd_.RevokeLeaseOf("/freeflow/v1/nodes/node-a"));
  // node-a's keys go (b notices through its watch) and come back under a new lease.
  EXPECT_TRUE(WaitFor([&] { return changes >= before + 2; }, 2s));
  EXPECT_TRUE(WaitFor([&] { return Sees(*b, "10.244.1.5", kA) && a->Healthy(); }, 2s));
  EXPECT_EQ(etcd_.Dump("/freeflow/v1/"),
            "/freeflow/v1/nodes/node-a={\"address\":\"127.0.0.1\",\"port\":7471} leased\n"
            "/freeflow/v1/nodes/node-b={\"address\":\"127.0.0.2\",\"port\":7472} leased\n"
            "/freeflow/v1/pods/10.244.1.5=node-a leased\n");
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

TEST_F(EtcdTest, WithdrawDoesNotDeleteAPodThatMovedToAnotherNode) {
  auto a = Router(kA, {"10.244.1.5"});
  auto b = Router(kB);
  auto c = Router(kC);
  ASSERT_TRUE(a && b && c);
  ASSERT_TRUE(WaitFor([&] { return Sees(*c, "10.244.1.5", kA); }, 1s));
  b->Publish(Ip("10.244.1.5"));  // the pod now lives on node-b
  ASSERT_TRUE(WaitFor([&] { return Sees(*c, "10.244.1.5", kB); }, 1s));
  a->Withdraw(Ip("10.244.1.5"));  // node-a cleans up late
  std::this_thread::sleep_for(200ms);
  EXPECT_TRUE(Sees(*c, "10.244.1.5", kB));
  EXPECT_TRUE(Sees(*a, "10.244.1.5", kB));
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

TEST_F(EtcdTest, CustomPrefixKeepsDeploymentsApart) {
  options_.prefix = "/other/";
  auto a = Router(kA, {"10.244.1.5"});
  options_.prefix = "/freeflow/v1/";
  auto b = Router(kB);
  ASSERT_TRUE(a && b);
  std::this_thread::sleep_for(200ms);
  EXPECT_TRUE(Unknown(*b, "10.244.1.5"));
  EXPECT_TRUE(b->Nodes().empty());
  EXPECT_NE(etcd_.Dump("/other/"), "");
}

}  // namespace
}  // namespace ff::cp
