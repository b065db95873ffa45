// The acceptor's listener for a direct connection inside a real pod's network namespace
// (root): three "pods" (network namespaces on a bridge in a fourth, the node's) and the test
// as their router in its own namespace. The listener must sit on pod b's address inside pod b's namespace, be
// reachable over the pod network from pod a, hand over only the connection that proves the
// secret, and refuse pod c even when c has learnt the port.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include "direct/direct_listener.h"
#include "freeflow/clock.h"
#include "freeflow/direct_stream.h"
#include "freeflow/protocol/direct_wire.h"
#include "identity/netns_probe.h"

namespace ff::router {
namespace {

// The pods' names and addresses; the tag keeps parallel runs apart.
std::string Tag() { return "ffdl" + std::to_string(::getpid() % 100000); }
std::string Ns(char pod) { return Tag() + pod; }
uint32_t Ip(char pod) { return 0x0afa0700u + 11 + static_cast<uint32_t>(pod - 'a'); }  // 10.250.7.11..
std::string Dotted(uint32_t ip) {
  in_addr a{htonl(ip)};
  return inet_ntoa(a);
}

int Sh(const std::string& cmd) { return std::system((cmd + " >/dev/null 2>&1").c_str()); }

class DirectListenerNetnsTest : public ::testing::Test {
 protected:
  // The bridge lives in a "node" namespace of its own: nothing is added to the test's. A
  // failure here fails every test (SetUp), rather than leaving them skipped.
  static void SetUpTestSuite() {
    const std::string node = Ns('n'), in_node = "ip -n " + node + " ";
    ready_ = Sh("ip netns add " + node) == 0 &&
             Sh(in_node + "link add name ffbr type bridge && " + in_node + "link set dev ffbr up") == 0;
    for (char pod : {'a', 'b', 'c'}) {
      const std::string ns = Ns(pod), veth = std::string("v") + pod, in_pod = "ip -n " + ns + " ";
      ready_ = ready_ && Sh("ip netns add " + ns) == 0 &&
               Sh(in_node + "link add name " + veth + " type veth peer name eth0 netns " + ns) == 0 &&
               Sh(in_node + "link set " + veth + " master ffbr up") == 0 &&
               Sh(in_pod + "addr add " + Dotted(Ip(pod)) + "/24 dev eth0") == 0 &&
               Sh(in_pod + "link set eth0 up && " + in_pod + "link set lo up") == 0;
    }
  }
  static void TearDownTestSuite() {
    for (char pod : {'a', 'b', 'c', 'n'}) Sh("ip netns del " + Ns(pod));
  }

  void SetUp() override {
    ASSERT_TRUE(ready_) << "could not build the pods' network namespaces (root? iproute2?)";
    ASSERT_EQ(loop_.Init(), 0);
    ASSERT_TRUE(NewDirectSecret(expect_.secret));
    expect_.conn = 7;
    expect_.dialler_ip = Ip('a');
    expect_.acceptor_ip = Ip('b');
    netns_b_ = UniqueFd(::open(("/var/run/netns/" + Ns('b')).c_str(), O_RDONLY | O_CLOEXEC));
    ASSERT_TRUE(netns_b_);
  }

  // A connection to pod b's listener from inside `pod`'s namespace, its hello sealed with
  // `secret` (empty: no hello). The socket stays in that namespace.
  UniqueFd DialFrom(char pod, uint16_t port, const uint8_t (&secret)[kDirectSecretBytes],
                    bool hello = true) {
    UniqueFd ns(::open(("/var/run/netns/" + Ns(pod)).c_str(), O_RDONLY | O_CLOEXEC));
    UniqueFd fd;
    std::string error;
    const bool ran = RunInNamespace(
        ns.get(),
        [&](dev_t, ino_t, std::string*) {
          fd = UniqueFd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
          sockaddr_in a{};
          a.sin_family = AF_INET;
          a.sin_addr.s_addr = htonl(Ip('b'));
          a.sin_port = htons(port);
          if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) fd.reset();
        },
        &error);
    EXPECT_TRUE(ran) << error;
    if (!fd || !hello) return fd;
    char frame[direct::kHelloFrameBytes];
    EXPECT_TRUE(SealHello(secret, SealMode::kEncrypt,
                          direct::Hello{direct::kMagic, direct::kVersion, 7, Ip('a'), Ip('b')},
                          frame));
    EXPECT_EQ(::send(fd.get(), frame, sizeof(frame), MSG_NOSIGNAL),
              static_cast<ssize_t>(sizeof(frame)));
    return fd;
  }

  uint16_t Open(DirectListeners& l) {
    uint16_t port = 0;
    std::string error;
    EXPECT_EQ(l.Open(netns_b_.get(), expect_,
                     [this](UniqueFd c, int e) {
                       conn_ = std::move(c);
                       error_ = e;
                     },
                     &port, &error),
              0)
        << error;
    return port;
  }
  void Run(DirectListeners& l, uint64_t ms) {
    const uint64_t end = MonotonicNs() + ms * 1'000'000;
    while (!error_ && MonotonicNs() < end) {
      loop_.RunOnce(10);
      l.Tick(MonotonicNs());
    }
  }

  static inline bool ready_ = false;
  EventLoop loop_;
  DirectListeners::Expect expect_;
  UniqueFd netns_b_;
  UniqueFd conn_;
  std::optional<int> error_;
};

TEST_F(DirectListenerNetnsTest, PodAReachesItsPeerInPodBsNamespaceOverThePodNetwork) {
  DirectListeners l({.port_lo = 40100, .port_hi = 40109, .timeout_ns = 3'000'000'000ull}, loop_);
  const uint16_t port = Open(l);
  EXPECT_GE(port, 40100);
  EXPECT_LE(port, 40109);
  UniqueFd a = DialFrom('a', port, expect_.secret);
  ASSERT_TRUE(a);
  ASSERT_EQ(::send(a.get(), "data", 4, MSG_NOSIGNAL), 4);
  Run(l, 2000);
  ASSERT_EQ(error_.value_or(-1), 0);
  // The handed-over socket is pod b's end: b's address, a's address as its peer.
  sockaddr_in self{}, peer{};
  socklen_t len = sizeof(self);
  ASSERT_EQ(::getsockname(conn_.get(), reinterpret_cast<sockaddr*>(&self), &len), 0);
  len = sizeof(peer);
  ASSERT_EQ(::getpeername(conn_.get(), reinterpret_cast<sockaddr*>(&peer), &len), 0);
  EXPECT_EQ(ntohl(self.sin_addr.s_addr), Ip('b'));
  EXPECT_EQ(ntohl(peer.sin_addr.s_addr), Ip('a'));
  char got[4];
  ASSERT_EQ(::recv(conn_.get(), got, sizeof(got), MSG_WAITALL), 4);
  EXPECT_EQ(std::string(got, 4), "data");
}

TEST_F(DirectListenerNetnsTest, PodCIsRefusedEvenWithTheSecretAndTheRightOneStillGetsIn) {
  DirectListeners l({.timeout_ns = 3'000'000'000ull}, loop_);
  const uint16_t port = Open(l);
  UniqueFd c = DialFrom('c', port, expect_.secret);  // even a stolen secret: wrong address
  ASSERT_TRUE(c);
  Run(l, 200);
  EXPECT_FALSE(error_);
  EXPECT_EQ(l.refused(), 1u);
  UniqueFd a = DialFrom('a', port, expect_.secret);
  Run(l, 2000);
  EXPECT_EQ(error_.value_or(-1), 0);
}

TEST_F(DirectListenerNetnsTest, TheListenerIsNotInTheRoutersNamespace) {
  DirectListeners l({.timeout_ns = 3'000'000'000ull}, loop_);
  const uint16_t port = Open(l);
  // Pod b's address is not in the test's (the router's) namespace: nothing listens here.
  UniqueFd here(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  EXPECT_NE(::connect(here.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  l.Tick(MonotonicNs() + 4'000'000'000ull);
  EXPECT_EQ(error_.value_or(-1), ETIMEDOUT);
}

}  // namespace
}  // namespace ff::router
