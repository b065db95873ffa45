// TCP mode's records go when their connection is gone from the namespaces of both ends: the
// sweep's logic, with the kernel's answers (sock_diag) played by FakeStreamProbe. The real
// sock_diag in real namespaces is tests/integration/tcp_mode/tcp_mode_records.sh.
#include <gtest/gtest.h>

#include "sock_pod.h"

namespace ff::router::test {
namespace {

const uint32_t kA = Ip("10.0.0.1");
const uint32_t kB = Ip("10.0.0.2");
constexpr uint16_t kServerPort = 5000;
constexpr uint16_t kClientPort = 40000;
constexpr uint64_t kMs = 1'000'000;
// The connection as each end's namespace knows it.
const TcpTuple kAtClient{kA, kClientPort, kB, kServerPort};
const TcpTuple kAtServer{kB, kServerPort, kA, kClientPort};

class StreamGcTest : public ::testing::Test {
 protected:
  explicit StreamGcTest(uint64_t grace_ns = 60'000 * kMs, PodLimits limits = DefaultPodLimits())
      : router_(TestRouter::Options{
            .limits = limits, .stream_gc_period_ns = 5 * kMs, .stream_unseen_grace_ns = grace_ns}) {
    a_ = std::make_unique<SockPod>(router_, kA, 1);
    b_ = std::make_unique<SockPod>(router_, kB, 2);
    EXPECT_EQ(a_->SockHello(), 0);
    EXPECT_EQ(b_->SockHello(), 0);
    EXPECT_EQ(b_->Listen(kServerPort), 0);
  }

  FakeStreamProbe& kernel() { return router_.streams(); }
  void Client(Presence p) { kernel().Set(kA, 1, kAtClient, p); }
  void Server(Presence p) { kernel().Set(kB, 2, kAtServer, p); }
  // Waits until `n` more sweeps than now have asked about the server's end of the
  // connection and been applied (one more question: the last one's answer is back).
  bool Sweeps(size_t n) {
    const size_t before = kernel().looks(kB, 2, kAtServer);
    return WaitFor([&] { return kernel().looks(kB, 2, kAtServer) >= before + n + 1; });
  }
  uint64_t Streams() { return router_.Stat("streams"); }

  TestRouter router_;
  std::unique_ptr<SockPod> a_, b_;
};

TEST_F(StreamGcTest, ARecordLivesWhileEitherEndHoldsTheConnection) {
  ASSERT_EQ(a_->Connect(kB, kClientPort, kServerPort).status, 0);
  Client(Presence::kAlive);
  ASSERT_TRUE(Sweeps(3));
  EXPECT_EQ(Streams(), 1u);
  Server(Presence::kAlive);
  ASSERT_EQ(b_->Claim(kA, kServerPort, kClientPort).status, 0);
  Client(Presence::kGone);  // the client closed; the server still reads what it sent
  ASSERT_TRUE(Sweeps(3));
  EXPECT_EQ(Streams(), 1u);
  EXPECT_EQ(b_->Claim(kA, kServerPort, kClientPort).status, 0);
  EXPECT_EQ(a_->Claim(kB, kClientPort, kServerPort).status, ENOENT);  // its end closed
  Server(Presence::kGone);
  EXPECT_TRUE(WaitFor([&] { return Streams() == 0; }));
  EXPECT_EQ(b_->Claim(kA, kServerPort, kClientPort).status, ENOENT);
}

TEST_F(StreamGcTest, TheServerEndAloneKeepsItToo) {
  ASSERT_EQ(a_->Connect(kB, kClientPort, kServerPort).status, 0);
  Server(Presence::kAlive);  // accepted; the client's side is already gone
  ASSERT_TRUE(Sweeps(3));
  EXPECT_EQ(Streams(), 1u);
  Server(Presence::kGone);
  EXPECT_TRUE(WaitFor([&] { return Streams() == 0; }));
}

// The kernel does not answer (sock_diag missing, a timeout): a record is never dropped on a
// guess, not even when it never showed its connection.
TEST_F(StreamGcTest, NoAnswerKeepsTheRecord) {
  ASSERT_EQ(a_->Connect(kB, kClientPort, kServerPort).status, 0);
  Client(Presence::kAlive);
  ASSERT_TRUE(Sweeps(2));
  Client(Presence::kUnknown);
  Server(Presence::kUnknown);
  ASSERT_TRUE(Sweeps(5));
  EXPECT_EQ(Streams(), 1u);
  EXPECT_EQ(a_->Claim(kB, kClientPort, kServerPort).status, 0);
}

// A pod's sessions end (its processes exec or exit): the records of its connections stay
// while its namespace holds them, and go once it no longer does.
TEST_F(StreamGcTest, RecordsOutliveTheSessionsOfTheirPods) {
  ASSERT_EQ(a_->Connect(kB, kClientPort, kServerPort).status, 0);
  Client(Presence::kAlive);
  Server(Presence::kAlive);
  a_.reset();
  b_.reset();
  EXPECT_TRUE(WaitFor([&] { return router_.Stat("sessions") == 0; }));
  ASSERT_TRUE(Sweeps(3));
  EXPECT_EQ(Streams(), 1u);
  Client(Presence::kGone);
  Server(Presence::kGone);
  EXPECT_TRUE(WaitFor([&] { return Streams() == 0; }));
}

// The router holds a pod's namespace only while a session of the pod or an open end of a
// record needs it: a pod that is gone is not kept alive by the router.
TEST_F(StreamGcTest, ANamespaceIsLetGoWhenNothingNeedsItAnyMore) {
  const size_t before = FakeStreamProbe::handles();
  ASSERT_EQ(a_->Connect(kB, kClientPort, kServerPort).status, 0);
  Client(Presence::kAlive);
  Server(Presence::kAlive);
  ASSERT_TRUE(Sweeps(2));
  a_.reset();  // A's sessions end; its end of the connection is still open
  ASSERT_TRUE(Sweeps(2));
  EXPECT_EQ(FakeStreamProbe::handles(), before);
  Client(Presence::kGone);  // now closed: A's namespace is no longer needed
  EXPECT_TRUE(WaitFor([&] { return FakeStreamProbe::handles() == before - 1; }));
  EXPECT_EQ(Streams(), 1u);  // B still holds it
}

class UnseenGraceTest : public StreamGcTest {
 protected:
  UnseenGraceTest() : StreamGcTest(1500 * kMs) {}
};

// A record asked for before the kernel connect shows in no namespace yet: it lives through
// the grace, then goes if the connection never came.
TEST_F(UnseenGraceTest, ARecordNeverSeenGoesAfterTheGrace) {
  ASSERT_EQ(a_->Connect(kB, kClientPort, kServerPort).status, 0);
  ASSERT_TRUE(Sweeps(2));
  EXPECT_EQ(Streams(), 1u);  // well within the grace
  EXPECT_EQ(b_->Claim(kA, kServerPort, kClientPort).status, 0);
  EXPECT_TRUE(WaitFor([&] { return Streams() == 0; }));
}

TEST_F(UnseenGraceTest, AConnectionThatComesWithinTheGraceKeepsIt) {
  ASSERT_EQ(a_->Connect(kB, kClientPort, kServerPort).status, 0);
  ASSERT_TRUE(Sweeps(1));
  Client(Presence::kAlive);
  ASSERT_TRUE(Sweeps(2));
  std::this_thread::sleep_for(std::chrono::milliseconds(1600));  // past the grace
  ASSERT_TRUE(Sweeps(2));
  EXPECT_EQ(Streams(), 1u);
}

class StreamChargeTest : public StreamGcTest {
 protected:
  StreamChargeTest() : StreamGcTest(60'000 * kMs, WithLimits({{Quota::kStreams, 1}})) {}
};

// A server that keeps a connection its client closed keeps the record: the record is then
// charged to the server's pod, not to the client's, whose quota it frees.
TEST_F(StreamChargeTest, TheChargeFollowsThePodThatKeepsTheConnection) {
  ASSERT_EQ(a_->Connect(kB, kClientPort, kServerPort).status, 0);
  ASSERT_EQ(b_->Listen(kServerPort + 1), 0);
  EXPECT_EQ(a_->Connect(kB, kClientPort + 1, kServerPort + 1).status, ENOSPC);
  Client(Presence::kAlive);
  Server(Presence::kAlive);
  ASSERT_TRUE(Sweeps(2));
  Client(Presence::kGone);
  ASSERT_TRUE(Sweeps(2));
  EXPECT_EQ(Streams(), 1u);
  EXPECT_EQ(a_->Connect(kB, kClientPort + 1, kServerPort + 1).status, 0);
  // B now holds its one record: a connect of its own is refused.
  ASSERT_EQ(a_->Listen(kServerPort), 0);
  EXPECT_EQ(b_->Connect(kA, kClientPort, kServerPort).status, ENOSPC);
}

TEST_F(StreamChargeTest, AKeeperOverItsQuotaLosesTheRecord) {
  ASSERT_EQ(a_->Listen(kServerPort), 0);
  ASSERT_EQ(b_->Connect(kA, kClientPort + 7, kServerPort).status, 0);  // B's one record
  ASSERT_EQ(a_->Connect(kB, kClientPort, kServerPort).status, 0);
  kernel().Set(kB, 2, TcpTuple{kB, kClientPort + 7, kA, kServerPort}, Presence::kAlive);
  Client(Presence::kAlive);
  Server(Presence::kAlive);
  ASSERT_TRUE(Sweeps(2));
  Client(Presence::kGone);
  EXPECT_TRUE(WaitFor([&] { return Streams() == 1; }));  // A's record could not move to B
  EXPECT_EQ(b_->Claim(kA, kServerPort, kClientPort).status, ENOENT);
  EXPECT_EQ(b_->Claim(kA, kClientPort + 7, kServerPort).status, 0);  // B's own record stays
}

}  // namespace
}  // namespace ff::router::test
