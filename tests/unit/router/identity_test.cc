// Pod identity without root: the choice of a namespace's one overlay address (the attacks
// of a pod with NET_ADMIN, as lists of addresses), the peer-process lookup used without
// SO_PEERPIDFD, a resolver that cannot start its thread, and the router refusing a second
// network namespace that claims an address in use. The same attacks in real namespaces
// against the real router: tests/integration/security/identity.sh.
#include "identity/identity.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <net/if.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "harness.h"
#include "identity/peer_process.h"

namespace ff::router {
namespace {

using test::Ip;
using test::RawPod;
using test::TestRouter;
using test::WaitFor;

constexpr unsigned kUp = IFF_UP | IFF_RUNNING;
const Ipv4Prefix kOverlay = *Ipv4Prefix::Parse("10.244.0.0/16");

struct Choice {
  bool ok = false;
  uint32_t ip = 0;
  std::string error;
};

Choice Choose(const std::vector<InterfaceAddress>& addresses, bool router_namespace = false) {
  Choice c;
  c.ok = ChooseOverlayAddress(addresses, kOverlay, router_namespace, &c.ip, &c.error);
  return c;
}

TEST(ChooseOverlayAddress, APodsOneAddressOnItsLinkedInterface) {
  const Choice c = Choose({{"lo", IFF_LOOPBACK | kUp, Ip("127.0.0.1"), false},
                           {"eth0", kUp, Ip("10.244.1.11"), true},
                           {"eth1", kUp, Ip("192.168.7.3"), true}});
  EXPECT_TRUE(c.ok) << c.error;
  EXPECT_EQ(c.ip, Ip("10.244.1.11"));
}

TEST(ChooseOverlayAddress, AVictimsAddressAddedToLoIsAmbiguous) {
  // ip addr add <victim>/32 dev lo: the namespace now has two overlay addresses, and the
  // first one listed is the victim's.
  const Choice c = Choose({{"lo", IFF_LOOPBACK | kUp, Ip("10.244.1.10"), false},
                           {"eth0", kUp, Ip("10.244.1.11"), true}});
  EXPECT_FALSE(c.ok);
  EXPECT_NE(c.error.find("2 addresses inside the overlay prefix"), std::string::npos) << c.error;
  EXPECT_NE(c.error.find("10.244.1.10 on lo"), std::string::npos) << c.error;
}

TEST(ChooseOverlayAddress, AnAddressOnlyOnLoopbackIsRefused) {
  const Choice c = Choose({{"lo", IFF_LOOPBACK | kUp, Ip("10.244.1.10"), false},
                           {"eth0", kUp, Ip("192.168.7.3"), true}});
  EXPECT_FALSE(c.ok);
  EXPECT_NE(c.error.find("loopback"), std::string::npos) << c.error;
  // Loopback is refused even in the router's namespace, where links are not required.
  EXPECT_FALSE(Choose({{"lo", IFF_LOOPBACK | kUp, Ip("10.244.1.10"), false}}, true).ok);
}

TEST(ChooseOverlayAddress, AnInterfaceThatIsDownIsRefused) {
  const Choice c = Choose({{"eth0", IFF_RUNNING, Ip("10.244.1.11"), true}});
  EXPECT_FALSE(c.ok);
  EXPECT_NE(c.error.find("down"), std::string::npos) << c.error;
}

TEST(ChooseOverlayAddress, AnInterfaceNotLinkedToTheRouterIsRefused) {
  // A namespace the pod made itself (unshare -n): a dummy interface with any address.
  const Choice c = Choose({{"dummy0", kUp, Ip("10.244.1.10"), false}});
  EXPECT_FALSE(c.ok);
  EXPECT_NE(c.error.find("not linked to the router's network namespace"), std::string::npos)
      << c.error;
  // In the router's own namespace (only with --allow-host-network-clients) links are moot.
  const Choice host = Choose({{"cni0", kUp, Ip("10.244.1.1"), false}}, true);
  EXPECT_TRUE(host.ok) << host.error;
  EXPECT_EQ(host.ip, Ip("10.244.1.1"));
}

TEST(ChooseOverlayAddress, NoOverlayAddressIsRefused) {
  const Choice c = Choose(
      {{"lo", IFF_LOOPBACK | kUp, Ip("127.0.0.1"), false}, {"eth0", kUp, Ip("192.168.7.3"), true}});
  EXPECT_FALSE(c.ok);
  EXPECT_NE(c.error.find("no IPv4 address inside the overlay prefix"), std::string::npos);
  EXPECT_FALSE(Choose({}).ok);
}

// A child process connected to a listener of the test; `conn` is the test's end. With
// `hand_over`, the child hands its socket to a grandchild and closes its own copy, staying
// alive. Both stay until the fixture goes (10 s at most).
class ConnectedChild {
 public:
  explicit ConnectedChild(bool hand_over) {
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::snprintf(addr.sun_path + 1, sizeof(addr.sun_path) - 1, "ff-identity-test-%d", ::getpid());
    const auto len =
        static_cast<socklen_t>(sizeof(sa_family_t) + 1 + std::strlen(addr.sun_path + 1));
    UniqueFd l(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    if (::bind(l.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
        ::listen(l.get(), 4) != 0 || ::pipe2(hold_, O_CLOEXEC) != 0)
      throw std::runtime_error("cannot set up a listener");
    pid = ::fork();
    if (pid == 0) Run(addr, len, hand_over);
    ::close(hold_[0]);
    conn.reset(::accept4(l.get(), nullptr, nullptr, SOCK_CLOEXEC));
  }
  ~ConnectedChild() {
    ::close(hold_[1]);
    ::waitpid(pid, nullptr, 0);
  }

  pid_t pid = 0;
  UniqueFd conn;

 private:
  [[noreturn]] void Run(const sockaddr_un& addr, socklen_t len, bool hand_over) {
    ::close(hold_[1]);
    UniqueFd c(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    if (::connect(c.get(), reinterpret_cast<const sockaddr*>(&addr), len) != 0) ::_exit(1);
    if (hand_over && ::fork() != 0) c.reset();  // only the grandchild holds the socket now
    pollfd p{hold_[0], POLLIN, 0};
    ::poll(&p, 1, 10000);  // readable (EOF) once the test closed its end
    ::_exit(0);
  }

  int hold_[2] = {-1, -1};
};

TEST(PeerProcess, WithoutPeerPidfdTheConnectingProcessIsFound) {
  ConnectedChild child(false);
  PeerProcess peer;
  std::string error;
  EXPECT_TRUE(FindPeerProcess(child.conn.get(), false, &peer, &error)) << error;
  EXPECT_EQ(peer.pid, child.pid);
  EXPECT_TRUE(peer.netns);  // the fallback names the namespace through /proc/<pid>/ns/net
}

TEST(PeerProcess, WithoutPeerPidfdAProcessNotHoldingTheSocketIsRefused) {
  // What a recycled pid looks like: the pid SO_PEERCRED names is a live process that does
  // not hold the other end of the connection.
  ConnectedChild child(true);
  PeerProcess peer;
  std::string error;
  ASSERT_TRUE(WaitFor([&] { return !FindPeerProcess(child.conn.get(), false, &peer, &error); }));
  EXPECT_NE(error.find("does not hold the other end"), std::string::npos) << error;
}

TEST(NetnsIdentityResolver, AThreadThatCannotStartIsAnErrorNotACrash) {
  const pid_t child = ::fork();
  if (child == 0) {
    auto resolver = MakeNetnsIdentityResolver({kOverlay});
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) ::_exit(2);
    // No new thread for this user: RLIMIT_NPROC binds once root (if we are) is left.
    if (::geteuid() == 0 &&
        (::setresgid(65534, 65534, 65534) != 0 || ::setresuid(65534, 65534, 65534) != 0))
      ::_exit(3);
    const rlimit none{0, 0};
    if (::setrlimit(RLIMIT_NPROC, &none) != 0) ::_exit(4);
    PodIdentity who;
    std::string error;
    const bool ok = resolver->Resolve(sv[1], &who, &error);
    ::_exit(!ok && error.find("cannot start a thread") != std::string::npos ? 0 : 5);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "the resolver killed its process (signal " << WTERMSIG(status)
                                 << ")";
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(PodSessions, AnAddressInUseFromAnotherNamespaceIsRefused) {
  TestRouter router({});
  const uint32_t ip = Ip("10.0.0.5");
  std::optional<RawPod> victim, same_pod;
  victim.emplace(router, ip, /*netns=*/1);
  ASSERT_EQ(victim->Hello(), 0);
  same_pod.emplace(router, ip, 1);  // another process of the same pod
  ASSERT_EQ(same_pod->Hello(), 0);

  RawPod impostor(router, ip, 2);
  EXPECT_EQ(impostor.Hello(), EACCES);
  EXPECT_NE(std::string(impostor.hello().node).find("in use by another network namespace"),
            std::string::npos)
      << impostor.hello().node;
  EXPECT_TRUE(impostor.Disconnected());
  EXPECT_EQ(victim->CreateCq(1), 1u);  // the victim is unaffected

  // Once the pod's sessions are gone, its address may belong to a new sandbox.
  victim.reset();
  same_pod.reset();
  EXPECT_TRUE(WaitFor([&] {
    RawPod next(router, ip, 2);
    return next.Hello() == 0;
  }));
}

// Neither kept (as a refused client waiting for its HELLO is) nor counted as refused, after
// `calls` identifications. Stats runs on the router's loop after the adoptions posted before.
void ExpectDroppedQuietly(TestRouter& router, size_t calls) {
  EXPECT_EQ(router.Stat("refused"), 0u);
  EXPECT_EQ(router.Stat("sessions"), 0u);
  EXPECT_EQ(router.IdentityCalls(), calls);
}

TEST(PodSessions, AProbeThatHangsUpIsNeitherIdentifiedNorRefused) {
  // The device plugin checks the router every 500 ms by connecting and hanging up, from the
  // node's network (which the router refuses): no identification, no refusal to log.
  TestRouter router({});
  router.ConnectAndHangUp();
  ExpectDroppedQuietly(router, 0);

  // One that said something before hanging up is identified as every client is.
  router.ConnectAndHangUp("x");
  router.Stats();  // after its adoption
  EXPECT_EQ(router.IdentityCalls(), 1u);

  RawPod pod(router, Ip("10.0.0.9"));  // pods are served as before
  EXPECT_EQ(pod.Hello(), 0);
}

TEST(PodSessions, AProbeThatHangsUpWhileBeingIdentifiedIsNotRefused) {
  // The router accepted the probe before it hung up: identified (and refused, it is in the
  // node's network), but gone by then.
  TestRouter router({});
  router.ConnectAndHangUpDuringIdentification();
  ExpectDroppedQuietly(router, 1);
}

}  // namespace
}  // namespace ff::router
