// The acceptor's router side of a direct connection: a one-time listener takes exactly the
// connection that proves the secret, and nothing that merely connects to its port.
// In the test's own network namespace, on loopback (no root needed).
#include "direct/direct_listener.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <optional>
#include <string>

#include "freeflow/clock.h"
#include "freeflow/direct_stream.h"
#include "freeflow/protocol/direct_wire.h"

namespace ff::router {
namespace {

constexpr uint32_t kLoopback = 0x7f000001;  // 127.0.0.1
constexpr uint32_t kOther = 0x7f000002;     // 127.0.0.2

struct Outcome {
  UniqueFd conn;
  int error = -1;
};

class DirectListenerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(loop_.Init(), 0);
    ASSERT_TRUE(NewDirectSecret(expect_.secret));
    expect_.conn = 42;
    expect_.dialler_ip = kLoopback;
    expect_.acceptor_ip = kLoopback;
  }

  DirectListeners::Options Opts(uint16_t lo = 0, uint16_t hi = 0) {
    DirectListeners::Options o;
    o.port_lo = lo;
    o.port_hi = hi;
    o.timeout_ns = 2'000'000'000ull;
    return o;
  }

  // Opens a listener whose outcome lands in outcome_.
  uint16_t Open(DirectListeners& l) {
    uint16_t port = 0;
    std::string error;
    EXPECT_EQ(l.Open(-1, expect_,
                     [this](UniqueFd c, int e) { outcome_ = Outcome{std::move(c), e}; }, &port,
                     &error),
              0)
        << error;
    return port;
  }

  // A TCP connection to the listener from `from` (host order).
  static UniqueFd Dial(uint16_t port, uint32_t from = kLoopback) {
    UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in src{};
    src.sin_family = AF_INET;
    src.sin_addr.s_addr = htonl(from);
    EXPECT_EQ(::bind(fd.get(), reinterpret_cast<sockaddr*>(&src), sizeof(src)), 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(kLoopback);
    a.sin_port = htons(port);
    EXPECT_EQ(::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    return fd;
  }

  // The dialler's first frame, sealed with `secret`, naming `conn`.
  static std::string HelloFrame(const uint8_t (&secret)[kDirectSecretBytes], uint64_t conn) {
    char frame[direct::kHelloFrameBytes];
    const direct::Hello hello{direct::kMagic, direct::kVersion, conn, kLoopback, kLoopback};
    EXPECT_TRUE(SealHello(secret, SealMode::kEncrypt, hello, frame));
    return std::string(frame, sizeof(frame));
  }

  static void Send(int fd, const std::string& bytes) {
    ASSERT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(bytes.size()));
  }

  // Turns the loop until the listener finished or about a second passed.
  void Run(DirectListeners& l) {
    const uint64_t end = MonotonicNs() + 1'000'000'000ull;
    while (!outcome_ && MonotonicNs() < end) {
      loop_.RunOnce(10);
      l.Tick(MonotonicNs());
    }
  }
  // The right dialler comes to `port`: its connection is handed over.
  void ExpectHandedOver(DirectListeners& l, uint16_t port) {
    UniqueFd d = Dial(port);
    Send(d.get(), HelloFrame(expect_.secret, 42));
    Run(l);
    ASSERT_TRUE(outcome_);
    EXPECT_EQ(outcome_->error, 0);
    EXPECT_TRUE(outcome_->conn);
  }
  // Turns the loop a few times: what arrived is handled.
  void Settle() {
    for (int i = 0; i < 20; ++i) loop_.RunOnce(5);
  }

  EventLoop loop_;
  DirectListeners::Expect expect_;
  std::optional<Outcome> outcome_;
};

TEST_F(DirectListenerTest, TheConnectionThatProvesTheSecretIsHandedOverWithoutItsHello) {
  DirectListeners l(Opts(), loop_);
  const uint16_t port = Open(l);
  UniqueFd d = Dial(port);
  Send(d.get(), HelloFrame(expect_.secret, 42) + "after");
  Run(l);
  ASSERT_TRUE(outcome_);
  ASSERT_EQ(outcome_->error, 0);
  char got[5];
  ASSERT_EQ(::recv(outcome_->conn.get(), got, sizeof(got), MSG_WAITALL), 5);
  EXPECT_EQ(std::string(got, 5), "after");
  EXPECT_EQ(l.open(), 0u);
  EXPECT_EQ(l.refused(), 0u);
}

TEST_F(DirectListenerTest, AStrangerWithTheWrongSecretIsClosedAndTheRightOneStillGetsIn) {
  DirectListeners l(Opts(), loop_);
  const uint16_t port = Open(l);
  uint8_t wrong[kDirectSecretBytes];
  ASSERT_TRUE(NewDirectSecret(wrong));
  UniqueFd stranger = Dial(port);
  Send(stranger.get(), HelloFrame(wrong, 42));
  Settle();
  EXPECT_FALSE(outcome_);
  EXPECT_EQ(l.refused(), 1u);
  EXPECT_EQ(l.refusals().count(DirectRefusal::kUnauthentic), 1u);
  char c;
  EXPECT_EQ(::recv(stranger.get(), &c, 1, 0), 0);  // closed on it
  ExpectHandedOver(l, port);
}

TEST_F(DirectListenerTest, AHelloForAnotherConnectionIsRefused) {
  DirectListeners l(Opts(), loop_);
  UniqueFd d = Dial(Open(l));
  Send(d.get(), HelloFrame(expect_.secret, 43));
  Settle();
  EXPECT_FALSE(outcome_);
  EXPECT_EQ(l.refused(), 1u);
  EXPECT_EQ(l.refusals().count(DirectRefusal::kUnauthentic), 1u);
}

TEST_F(DirectListenerTest, AConnectionFromAnotherAddressIsClosedUnread) {
  DirectListeners l(Opts(), loop_);
  UniqueFd d = Dial(Open(l), kOther);
  Send(d.get(), HelloFrame(expect_.secret, 42));
  Settle();
  EXPECT_FALSE(outcome_);
  EXPECT_EQ(l.refused(), 1u);
  EXPECT_EQ(l.refusals().count(DirectRefusal::kAddress), 1u);
}

TEST_F(DirectListenerTest, SilentConnectionsDoNotKeepTheRightOneOut) {
  DirectListeners l(Opts(), loop_);
  const uint16_t port = Open(l);
  UniqueFd silent[kDirectCandidates + 2];
  for (UniqueFd& s : silent) {  // each accepted before the next (the kernel's backlog is short)
    s = Dial(port);
    Settle();
  }
  EXPECT_EQ(l.refused(), 2u);  // the oldest gave way to newer ones
  EXPECT_EQ(l.refusals().count(DirectRefusal::kCrowded), 2u);
  ExpectHandedOver(l, port);
}

TEST_F(DirectListenerTest, NobodyComingEndsTheListenerWithETIMEDOUT) {
  DirectListeners l(Opts(), loop_);
  Open(l);
  l.Tick(MonotonicNs() + 3'000'000'000ull);
  ASSERT_TRUE(outcome_);
  EXPECT_EQ(outcome_->error, ETIMEDOUT);
  EXPECT_FALSE(outcome_->conn);
  EXPECT_EQ(l.open(), 0u);
}

TEST_F(DirectListenerTest, ListenersTakePortsOfTheRangeAndSayWhenItIsFull) {
  // Two free ports next to each other, found by binding a throwaway listener.
  UniqueFd probe(::socket(AF_INET, SOCK_STREAM, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(kLoopback);
  ASSERT_EQ(::bind(probe.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  socklen_t len = sizeof(a);
  ASSERT_EQ(::getsockname(probe.get(), reinterpret_cast<sockaddr*>(&a), &len), 0);
  const uint16_t lo = ntohs(a.sin_port);
  probe.reset();
  DirectListeners l(Opts(lo, lo), loop_);
  EXPECT_EQ(Open(l), lo);
  uint16_t port = 0;
  std::string error;
  EXPECT_EQ(l.Open(-1, expect_, [](UniqueFd, int) {}, &port, &error), EADDRINUSE);
  EXPECT_NE(error.find("127.0.0.1"), std::string::npos) << error;
}

}  // namespace
}  // namespace ff::router
