// etcd's user/password tokens run out: etcd forgets a simple token left unused for
// --auth-token-ttl seconds, and every token of a user whose password is set. A router whose
// token etcd rejects authenticates again and repeats the call, without losing its
// connection, its lease or its watch.
#include <thread>

#include "etcd_secure_fixture.h"
#include "log_capture.h"

namespace ff::cp {
namespace {

using ff::testing::LogCapture;

// etcd forgets a token after 1 s unused.
class EtcdShortTokenTest : public EtcdSecureTest {
 public:
  EtcdShortTokenTest() { token_ttl_s_ = 1; }
};

// Samples a router's health every 20 ms from a thread; false once it was ever unhealthy.
class HealthWatch {
 public:
  explicit HealthWatch(const ControlPlane& cp) : cp_(cp) {
    thread_ = std::thread([this] {
      while (!stop_) {
        if (!cp_.Healthy()) always_ = false;
        std::this_thread::sleep_for(20ms);
      }
    });
  }
  ~HealthWatch() { Stop(); }
  bool Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    return always_;
  }

 private:
  const ControlPlane& cp_;
  std::atomic<bool> stop_{false}, always_{true};
  std::thread thread_;
};

TEST_F(EtcdShortTokenTest, AnExpiredTokenIsRenewed) {
  options_.lease_ttl = 30000ms;  // refreshed every 10 s: nothing uses the token meanwhile
  LogCapture log(spdlog::level::info);
  auto a = Router(kA, As("node-a", "pw-a"), {"10.244.1.5"});
  auto b = Router(kB, As("node-b", "pw-b"));
  ASSERT_TRUE(a && b);
  ASSERT_TRUE(WaitFor([&] { return Sees(*b, "10.244.1.5", kA); }, 2s));
  ASSERT_EQ(log.Count({"authenticating again"}), 0);
  HealthWatch health(*a);
  std::this_thread::sleep_for(2500ms);  // node-a's token expires
  a->Publish(Ip("10.244.1.6"));
  EXPECT_TRUE(WaitFor([&] { return Sees(*b, "10.244.1.6", kA); }, 2s));
  EXPECT_EQ(log.Count({"etcd rejected the token of user \"node-a\"", "invalid auth token",
                       "authenticating again"}),
            1);
  EXPECT_TRUE(health.Stop()) << "node-a lost its connection";
  EXPECT_EQ(log.Count({"connected to etcd"}), 2) << "a reconnection instead of a new token";
  // And again later: it still works after the renewed token expires in turn.
  std::this_thread::sleep_for(2500ms);
  a->Withdraw(Ip("10.244.1.5"));
  EXPECT_TRUE(WaitFor([&] { return !b->Lookup(Ip("10.244.1.5")); }, 2s));
  EXPECT_EQ(log.Count({"etcd rejected the token of user \"node-a\""}), 2);
}

TEST_F(EtcdSecureTest, ATokenInvalidatedBySettingThePasswordIsRenewed) {
  LogCapture log(spdlog::level::info);
  auto a = Router(kA, As("node-a", "pw-a"), {"10.244.1.5"});
  auto c = Router(kC, As("node-c"));
  ASSERT_TRUE(a && c);
  ASSERT_TRUE(WaitFor([&] { return Sees(*c, "10.244.1.5", kA); }, 2s));
  HealthWatch health(*a);
  // An operator runs the script again: the same password, set anew, drops node-a's tokens.
  ASSERT_EQ(etcd_->Admin("printf \"pw-a\\n\" | " + kAuth + " -s node node-a"), 0);
  a->Publish(Ip("10.244.1.6"));
  EXPECT_TRUE(WaitFor([&] { return Sees(*c, "10.244.1.6", kA); }, 2s));
  EXPECT_GE(log.Count({"etcd rejected the token of user \"node-a\"", "authenticating again"}), 1);
  EXPECT_TRUE(health.Stop()) << "node-a lost its connection";

  // A new password node-a does not know: refused, said so, and node-a stops announcing.
  ASSERT_EQ(etcd_->Admin("printf \"changed\\n\" | " + kAuth + " -s node node-a"), 0);
  a->Publish(Ip("10.244.1.7"));
  EXPECT_TRUE(WaitFor(
      [&] {
        return log.Count({"etcd refused user \"node-a\"", "a wrong password"}) >= 1;
      },
      5s));
  EXPECT_TRUE(WaitFor([&] { return !a->Healthy(); }, 2s));
  EXPECT_FALSE(c->Lookup(Ip("10.244.1.7")));
}

}  // namespace
}  // namespace ff::cp
