// The identity resolver without SO_PEERPIDFD (as on Linux < 6.5), needing root: each test
// runs as pid 1 of new pid, mount and network namespaces, where it can make the kernel
// hand a dead client's pid to another process (ns_last_pid). A pid recycled between
// connect() and the router's look-up must be refused; a live client is resolved through
// /proc/<pid>/ns/net.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>

#include "freeflow/fd.h"
#include "identity/identity.h"

namespace ff::router {
namespace {

const Ipv4Prefix kOverlay = *Ipv4Prefix::Parse("10.77.0.0/16");

socklen_t AbstractAddress(sockaddr_un* addr) {
  addr->sun_family = AF_UNIX;
  std::snprintf(addr->sun_path + 1, sizeof(addr->sun_path) - 1, "ff-identity-fallback");
  return static_cast<socklen_t>(sizeof(sa_family_t) + 1 + std::strlen(addr->sun_path + 1));
}

// Forks a client that connects to the test's listener and stays until `hold` reads EOF (or
// 10 s pass). With `hand_over`, the socket moves to a grandchild and the client exits.
pid_t Client(const int hold[2], bool hand_over) {
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  ::close(hold[1]);
  sockaddr_un addr{};
  const socklen_t len = AbstractAddress(&addr);
  UniqueFd c(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (::connect(c.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0) ::_exit(1);
  if (hand_over && ::fork() != 0) ::_exit(0);  // the grandchild keeps the socket
  pollfd p{hold[0], POLLIN, 0};
  ::poll(&p, 1, 10000);
  ::_exit(0);
}

// A process that gets pid `pid` (the last one handed out is set just below it) and waits
// for `hold`. Returns the pid it got.
pid_t ProcessWithPid(pid_t pid, const int hold[2]) {
  std::ofstream("/proc/sys/kernel/ns_last_pid") << (pid - 1);
  const pid_t got = ::fork();
  if (got != 0) return got;
  ::close(hold[1]);
  pollfd p{hold[0], POLLIN, 0};
  ::poll(&p, 1, 10000);
  ::_exit(0);
}

// The namespace the resolver serves: one overlay address on an interface that is up.
std::string SetUpNetwork() {
  if (std::system("ip link add d0 type veth peer name d1 && ip addr add 10.77.0.1/24 dev d0 && "
                  "ip link set d1 up && ip link set d0 up") != 0)
    return "cannot set up the test's network namespace with ip(8)";
  return "";
}

std::string Resolve(IdentityResolver& r, int sock, PodIdentity* who) {
  std::string error;
  return r.Resolve(sock, who, &error) ? "" : error;
}

// Pid 1 of the test's namespaces: "" when everything held, else what did not.
std::string RecycledPidScenario() {
  if (std::string e = SetUpNetwork(); !e.empty()) return e;
  auto fallback = MakeNetnsIdentityResolver({kOverlay, true, false});
  auto strict = MakeNetnsIdentityResolver({kOverlay, false, false});
  sockaddr_un addr{};
  const socklen_t len = AbstractAddress(&addr);
  UniqueFd l(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (::bind(l.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0 || ::listen(l.get(), 4) != 0)
    return "cannot listen";
  int hold[2];
  if (::pipe2(hold, O_CLOEXEC) != 0) return "pipe";

  // A live client: resolved through the fallback, as this namespace's one address.
  const pid_t live = Client(hold, false);
  UniqueFd conn(::accept4(l.get(), nullptr, nullptr, SOCK_CLOEXEC));
  PodIdentity who;
  if (std::string e = Resolve(*fallback, conn.get(), &who); !e.empty()) return "live: " + e;
  if (who.pid != live || who.ip != *ParseIpv4("10.77.0.1"))
    return "live: resolved as pid " + std::to_string(who.pid) + " " + FormatIpv4(who.ip);
  if (Resolve(*strict, conn.get(), &who).find("router's own network namespace") ==
      std::string::npos)
    return "the router's own namespace was served without --allow-host-network-clients";

  // A client that connected and exited; its pid now belongs to another process.
  const pid_t gone = Client(hold, true);
  if (::waitpid(gone, nullptr, 0) != gone) return "waitpid";
  conn.reset(::accept4(l.get(), nullptr, nullptr, SOCK_CLOEXEC));
  const pid_t recycled = ProcessWithPid(gone, hold);
  if (recycled != gone) return "the kernel did not hand out pid " + std::to_string(gone) + " again";
  const std::string e = Resolve(*fallback, conn.get(), &who);
  if (e.find("does not hold the other end") == std::string::npos)
    return "a recycled pid was " +
           (e.empty() ? "served as " + FormatIpv4(who.ip) : "refused: " + e);
  ::close(hold[1]);
  return "";
}

// Runs `scenario` as pid 1 of new pid, mount and network namespaces.
std::string InNamespaces(const std::function<std::string()>& scenario) {
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return "pipe";
  const pid_t realm = ::fork();
  if (realm == 0) {
    ::close(out[0]);
    if (::unshare(CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWNET) != 0) ::_exit(1);
    const pid_t init = ::fork();
    if (init == 0) {
      std::string result = "cannot mount /proc for the new pid namespace";
      if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0 &&
          ::mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) == 0)
        result = scenario();
      if (::write(out[1], result.data(), result.size()) < 0) ::_exit(2);
      ::_exit(0);
    }
    int status = 0;
    ::waitpid(init, &status, 0);
    ::_exit(WIFEXITED(status) ? WEXITSTATUS(status) : 3);
  }
  ::close(out[1]);
  std::string result;
  char buf[512];
  for (ssize_t n; (n = ::read(out[0], buf, sizeof(buf))) > 0;) result.append(buf, n);
  ::close(out[0]);
  int status = 0;
  ::waitpid(realm, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return "the namespaces' pid 1 failed (status " + std::to_string(status) + ")";
  return result;
}

TEST(IdentityWithoutPeerPidfd, ARecycledPidIsRefusedALiveClientIsServed) {
  ASSERT_EQ(::geteuid(), 0u) << "needs root (pid and network namespaces)";
  EXPECT_EQ(InNamespaces(RecycledPidScenario), "");
}

}  // namespace
}  // namespace ff::router
