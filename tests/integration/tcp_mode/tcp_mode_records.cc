// Integration (root): TCP mode's records against the real router and the kernel's sock_diag.
// Two pods (network namespaces the script made) each run a child of this program that speaks
// the socket-session protocol itself (tests/common/raw_pod.h) and holds real TCP sockets; the
// parent drives them step by step and checks, through claims, that a record lives while
// either end's namespace holds the connection and goes once neither does.
//
//   tcp_mode_records SOCKET SERVER_NS SERVER_IP CLIENT_NS CLIENT_IP ROUTER_PID ROUTER_LOG
// (namespaces as /run/netns paths, addresses dotted; the router logs at info, so that its
// stats line, asked for with SIGUSR1, counts the records). Exit 0 when every check passed.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include "freeflow/fd.h"
#include "freeflow/protocol.h"
#include "raw_pod.h"

namespace {

using ff::UniqueFd;
using ff::test::RawPod;

// A command from the parent to a child, answered with one int.
struct Command {
  char op;  // L listen, C connect, A accept, M claim, X close the connection, Q quit
  uint16_t port = 0;
  uint16_t peer_port = 0;
};

constexpr uint16_t kListenPort = 18770;
constexpr int kSweepWaitMs = 5000;      // more than two sweeps (kStreamGcPeriodNs = 2 s)
constexpr int kGoneDeadlineMs = 15000;  // a sweep, TIME_WAIT-free close, and another sweep

// What a child holds: its session, its listening socket and its one connection.
struct Child {
  RawPod* pod;
  uint32_t peer_ip;  // host order
  uint32_t own_ip;
  UniqueFd listener;
  UniqueFd conn;
};

int SockCall(RawPod& pod, ff::proto::Op op, uint32_t peer_ip, uint16_t local, uint16_t peer) {
  ff::proto::SockClaim m{};  // the three tuple requests share one layout
  m.peer_ip = htonl(peer_ip);
  m.local_port = local;
  m.peer_port = peer;
  std::vector<UniqueFd> fds;
  const ff::proto::Response r = pod.Call(m, {}, &fds, op);
  if (r.status != 0) return -r.status;
  // [segment, side, bell]
  return fds.size() == 3 ? 100 + static_cast<int>(r.u.sock.role) : -EPROTO;
}

int Listen(Child& c, uint16_t port) {
  ff::proto::SockListen m{};
  m.port = port;
  if (const int st = c.pod->Call(m).status) return -st;
  c.listener.reset(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  const int one = 1;
  ::setsockopt(c.listener.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (::bind(c.listener.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::listen(c.listener.get(), 8) != 0)
    return -errno;
  return 0;
}

// Binds to the pod's address (the tuple the router records), asks, then connects.
int Connect(Child& c, uint16_t peer_port) {
  c.conn.reset(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(c.own_ip);
  socklen_t len = sizeof(a);
  if (::bind(c.conn.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(c.conn.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0)
    return -errno;
  const uint16_t local = ntohs(a.sin_port);
  const int st = SockCall(*c.pod, ff::proto::Op::kSockConnect, c.peer_ip, local, peer_port);
  if (st != 100 + static_cast<int>(ff::proto::kStreamClient)) return st < 0 ? st : -EPROTO;
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(peer_port);
  to.sin_addr.s_addr = htonl(c.peer_ip);
  if (::connect(c.conn.get(), reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) return -errno;
  return local;
}

int Serve(Child& c, const Command& cmd) {
  switch (cmd.op) {
    case 'L':
      return Listen(c, cmd.port);
    case 'C':
      return Connect(c, cmd.peer_port);
    case 'A':
      c.conn.reset(::accept4(c.listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
      return c.conn ? 0 : -errno;
    case 'M':
      return SockCall(*c.pod, ff::proto::Op::kSockClaim, c.peer_ip, cmd.port, cmd.peer_port);
    case 'X':
      c.conn.reset();
      return 0;
    default:
      return -EINVAL;
  }
}

// A child: enters its pod's namespace, opens a socket session, then serves commands.
[[noreturn]] void RunChild(int ctl, const char* sock, const char* ns, uint32_t own, uint32_t peer) {
  UniqueFd nsfd(::open(ns, O_RDONLY | O_CLOEXEC));
  if (!nsfd || ::setns(nsfd.get(), CLONE_NEWNET) != 0) {
    std::perror(ns);
    ::_exit(2);
  }
  RawPod pod(ff::test::ConnectToRouter(sock));
  ff::proto::SockHello hello{};
  hello.abi = ff::kAbiVersion;
  const int st = pod.Call(hello).status;
  Child c{&pod, peer, own, {}, {}};
  int result = st == 0 ? 0 : -st;
  if (::write(ctl, &result, sizeof(result)) != sizeof(result) || st != 0) ::_exit(3);
  Command cmd{};
  while (::read(ctl, &cmd, sizeof(cmd)) == sizeof(cmd) && cmd.op != 'Q') {
    result = Serve(c, cmd);
    if (::write(ctl, &result, sizeof(result)) != sizeof(result)) break;
  }
  ::_exit(0);
}

struct Pods {
  int server = -1, client = -1;  // control sockets
};

int Ask(int ctl, char op, uint16_t port = 0, uint16_t peer_port = 0) {
  const Command cmd{op, port, peer_port};
  int result = -EIO;
  if (::write(ctl, &cmd, sizeof(cmd)) != sizeof(cmd) ||
      ::read(ctl, &result, sizeof(result)) != sizeof(result))
    return -EIO;
  return result;
}

int failures = 0;
void Check(bool ok, const std::string& what) {
  std::printf("%s %s\n", ok ? "PASS" : "FAIL", what.c_str());
  std::fflush(stdout);
  failures += ok ? 0 : 1;
}

// Asks `ctl` to claim (port, peer_port) until the router says ENOENT, within the deadline.
bool ClaimGoes(int ctl, uint16_t port, uint16_t peer_port) {
  for (int waited = 0; waited < kGoneDeadlineMs; waited += 200) {
    if (Ask(ctl, 'M', port, peer_port) == -ENOENT) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return false;
}

void Sleep(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

// The router's count of records: it logs a stats line on SIGUSR1. -1 when none came.
pid_t router_pid = 0;
const char* router_log = nullptr;
long Streams() {
  auto last_stats = [] {
    std::ifstream in(router_log);
    std::string line, last;
    size_t n = 0;
    while (std::getline(in, line)) {
      if (line.find(" stats: ") != std::string::npos) {
        last = line;
        ++n;
      }
    }
    return std::make_pair(n, last);
  };
  const size_t before = last_stats().first;
  if (::kill(router_pid, SIGUSR1) != 0) return -1;
  for (int i = 0; i < 100; ++i) {
    const auto [n, line] = last_stats();
    const size_t at = line.find(" streams=");
    if (n > before && at != std::string::npos) return std::stol(line.substr(at + 9));
    Sleep(20);
  }
  return -1;
}

constexpr int kServerRole = 100 + static_cast<int>(ff::proto::kStreamServer);
constexpr int kClientRole = 100 + static_cast<int>(ff::proto::kStreamClient);

// One connection; `first` ends it first (its side leaves FIN_WAIT for TIME_WAIT later), the
// other still holds it through two sweeps, then ends it too.
void Scenario(const Pods& p, bool client_first) {
  const std::string name = client_first ? "client closes first: " : "server closes first: ";
  const int cport = Ask(p.client, 'C', 0, kListenPort);
  Check(cport > 0, name + "SockConnect answered with a segment and the kernel connected");
  if (cport <= 0) return;
  const auto c = static_cast<uint16_t>(cport);
  Check(Ask(p.server, 'A') == 0, name + "the server accepted");
  Check(Ask(p.server, 'M', kListenPort, c) == kServerRole, name + "the server claimed its end");
  const int first = client_first ? p.client : p.server;
  const int keeper = client_first ? p.server : p.client;
  const auto [kp, kpeer] = client_first ? std::pair<uint16_t, uint16_t>{kListenPort, c}
                                        : std::pair<uint16_t, uint16_t>{c, kListenPort};
  Ask(first, 'X');
  Sleep(kSweepWaitMs);
  Check(Ask(keeper, 'M', kp, kpeer) == (client_first ? kServerRole : kClientRole) && Streams() == 1,
        name + "the record survives while the other end holds the connection");
  Ask(keeper, 'X');
  Check(ClaimGoes(keeper, kp, kpeer) && Streams() == 0,
        name + "the record goes once both ends closed");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 8) {
    std::fprintf(stderr,
                 "usage: %s SOCKET SERVER_NS SERVER_IP CLIENT_NS CLIENT_IP ROUTER_PID ROUTER_LOG\n",
                 argv[0]);
    return 2;
  }
  router_pid = static_cast<pid_t>(std::atoi(argv[6]));
  router_log = argv[7];
  in_addr server_ip{}, client_ip{};
  if (::inet_pton(AF_INET, argv[3], &server_ip) != 1 ||
      ::inet_pton(AF_INET, argv[5], &client_ip) != 1)
    return 2;
  Pods p;
  pid_t kids[2] = {-1, -1};
  for (int i = 0; i < 2; ++i) {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) return 2;
    kids[i] = ::fork();
    if (kids[i] == 0) {
      ::close(sv[0]);
      if (i == 0)
        RunChild(sv[1], argv[1], argv[2], ntohl(server_ip.s_addr), ntohl(client_ip.s_addr));
      RunChild(sv[1], argv[1], argv[4], ntohl(client_ip.s_addr), ntohl(server_ip.s_addr));
    }
    ::close(sv[1]);
    timeval tv{60, 0};  // a child that hangs fails the test instead of stalling it
    ::setsockopt(sv[0], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    (i == 0 ? p.server : p.client) = sv[0];
    int hello = -EIO;
    Check(::read(sv[0], &hello, sizeof(hello)) == sizeof(hello) && hello == 0,
          std::string(i == 0 ? "server" : "client") + " pod opened a socket session");
  }
  Check(Ask(p.server, 'L', kListenPort) == 0, "the server registered its listening port");
  Scenario(p, true);
  Scenario(p, false);
  for (int ctl : {p.server, p.client}) {
    const Command quit{'Q'};
    (void)!::write(ctl, &quit, sizeof(quit));
  }
  for (pid_t k : kids) ::waitpid(k, nullptr, 0);
  return failures == 0 ? 0 : 1;
}
