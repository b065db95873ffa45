#include "router_link.h"

#include <arpa/inet.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "freeflow/clock.h"
#include "freeflow/router_socket.h"
#include "freeflow/stream_pods.h"
#include "freeflow/tunables.h"
#include "log.h"
#include "real.h"

namespace ff::fsocket {
namespace {

Config ReadConfig() {
  Config c;
  const char* prefix = std::getenv("VNET_PREFIX");
  if (prefix == nullptr || *prefix == '\0') return c;
  auto parsed = ff::Ipv4Prefix::Parse(prefix);
  if (!parsed) {
    LogError("VNET_PREFIX=%s is not an IPv4 prefix: TCP mode is off", prefix);
    return c;
  }
  c.enabled = true;
  c.prefix = *parsed;
  c.socket_path = ff::RouterSocketPathFromEnv();
  return c;
}

struct Link {
  std::mutex mu;
  ff::UniqueFd sock;
  pid_t pid = 0;
  uint32_t seq = 0;
  uint32_t ip = 0;
  uint64_t retry_at = 0;
  uint64_t generation = 0;  // sessions opened so far (a new one forgot every registration)
  ff::Mapping pods;         // the router's pod list (stream_pods.h), read-only; or nothing
};
Link& TheLink() {
  static Link* link = new Link;  // never destroyed: interposers run during exit
  return *link;
}

// Waits up to kRouterCallTimeoutS for a datagram on `fd`.
int AwaitAnswer(int fd) {
  pollfd p{fd, POLLIN, 0};
  for (;;) {
    const int n = real::poll(&p, 1, ff::kRouterCallTimeoutS * 1000);
    if (n > 0) return 0;
    if (n == 0) return ETIMEDOUT;
    if (errno != EINTR) return errno;
  }
}

int Exchange(Link& l, const void* req, size_t len, int* status, ff::proto::Response* resp,
             ff::UniqueFd* fds, int max_fds, int* nfds) {
  char buf[ff::proto::kMaxMessage];
  std::memcpy(buf, req, len);
  ff::proto::Header h;
  std::memcpy(&h, buf, sizeof(h));
  if (++l.seq == ff::proto::kPostedSeq) l.seq = 1;
  h.seq = l.seq;
  std::memcpy(buf, &h, sizeof(h));
  if (int rc = ff::SendWithFds(l.sock.get(), buf, len, nullptr, 0, MSG_NOSIGNAL)) return rc;
  if (int rc = AwaitAnswer(l.sock.get())) return rc;
  size_t got = 0;
  int n = 0;
  ff::UniqueFd scratch[ff::proto::kMaxFds];
  ff::UniqueFd* into = fds != nullptr ? fds : scratch;
  const int cap = fds != nullptr ? max_fds : ff::proto::kMaxFds;
  if (int rc = ff::RecvWithFds(l.sock.get(), resp, sizeof(*resp), into, cap, &n, &got)) return rc;
  if (got == 0) return ENOTCONN;
  if (got != sizeof(*resp) || resp->h.seq != h.seq || resp->h.op != h.op || resp->status < 0)
    return EPROTO;
  *status = resp->status;
  if (nfds != nullptr) *nfds = n;
  return 0;
}

void MapPodList(Link& l, int fd);

// Opens the session if this process has none (or inherited its parent's); caller holds mu.
int Open(Link& l) {
  const pid_t me = ::getpid();
  if (l.sock && l.pid == me) return 0;
  l.sock.reset();
  const Config& c = GetConfig();
  if (!c.enabled) return ENOTCONN;
  const uint64_t now = ff::MonotonicNs();
  if (now < l.retry_at) return ENOTCONN;
  l.retry_at = now + ff::kSockRouterRetryNs;
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (c.socket_path.size() >= sizeof(a.sun_path)) return ENAMETOOLONG;
  std::memcpy(a.sun_path, c.socket_path.c_str(), c.socket_path.size() + 1);
  ff::UniqueFd s(real::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!s) return errno;
  if (real::connect(s.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    LogDebug("no router at %s (%s): kernel TCP only", c.socket_path.c_str(), strerror(errno));
    return ENOTCONN;
  }
  l.sock = std::move(s);
  l.pid = me;
  ff::proto::SockHello hello{};
  hello.abi = ff::kAbiVersion;
  ff::proto::Response r{};
  int status = 0, nfds = 0;
  ff::UniqueFd list;
  int rc = Exchange(l, &hello, sizeof(hello), &status, &r, &list, 1, &nfds);
  if (rc == 0 && status != 0) {
    r.u.hello.node[sizeof(r.u.hello.node) - 1] = '\0';
    LogError("router %s refused this process: %s (%s)", c.socket_path.c_str(), r.u.hello.node,
             strerror(status));
    rc = status;
  }
  if (rc != 0) {
    l.sock.reset();
    return rc == ENOTCONN ? rc : ENOTCONN;
  }
  l.ip = ntohl(r.u.hello.ip);
  l.retry_at = 0;
  ++l.generation;
  MapPodList(l, nfds == 1 ? list.get() : -1);
  return 0;
}

// Maps the pod list a session came with; without a usable one every connection asks.
void MapPodList(Link& l, int fd) {
  l.pods.reset();
  if (fd < 0) return;
  // Read-only for every holder, and never shorter than what is mapped.
  if (!ff::SealedReadOnly(fd)) {
    LogError("the router's pod list is not sealed read-only: not used");
    return;
  }
  ff::Mapping m;
  if (ff::MapPeerSegment(fd, ff::kStreamPodsBytes, false, &m) != 0) return;
  if (m.as<const ff::StreamPodsHeader>()->magic != ff::kStreamPodsMagic) return;
  l.pods = std::move(m);
}

}  // namespace

const Config& GetConfig() {
  static const Config* c = new Config(ReadConfig());
  return *c;
}

bool InOverlay(uint32_t addr) {
  const Config& c = GetConfig();
  return c.enabled && c.prefix.Contains(addr);
}

int RouterCall(const void* req, size_t len, int* status, ff::proto::Response* resp,
               ff::UniqueFd* fds, int max_fds, int* nfds) {
  Link& l = TheLink();
  std::lock_guard lock(l.mu);
  const bool had_session = l.sock && l.pid == ::getpid();
  if (int rc = Open(l)) return rc;
  int rc = Exchange(l, req, len, status, resp, fds, max_fds, nfds);
  if (rc != 0 && had_session && (rc == EPIPE || rc == ECONNRESET || rc == ENOTCONN)) {
    // The router went away since the last call (a restart): a new one may be there already.
    LogDebug("router session lost (%s): opening another", strerror(rc));
    l.sock.reset();
    l.retry_at = 0;
    if (int again = Open(l)) return again;
    rc = Exchange(l, req, len, status, resp, fds, max_fds, nfds);
  }
  if (rc != 0) {
    LogError("router call failed: %s; kernel TCP until it answers again", strerror(rc));
    l.sock.reset();  // a stream out of step is useless; the next call opens a new one
    l.retry_at = ff::MonotonicNs() + ff::kSockRouterRetryNs;
  }
  return rc;
}

int RouterPost(const void* req, size_t len) {
  Link& l = TheLink();
  std::lock_guard lock(l.mu);
  if (!l.sock || l.pid != ::getpid()) return ENOTCONN;  // nothing to tell a new session
  char buf[ff::proto::kMaxMessage];
  std::memcpy(buf, req, len);
  ff::proto::Header h;
  std::memcpy(&h, buf, sizeof(h));
  h.seq = ff::proto::kPostedSeq;
  std::memcpy(buf, &h, sizeof(h));
  return ff::SendWithFds(l.sock.get(), buf, len, nullptr, 0, MSG_NOSIGNAL | MSG_DONTWAIT);
}

uint64_t SessionGeneration() {
  Link& l = TheLink();
  std::lock_guard lock(l.mu);
  return l.generation;
}

ff::PodListed ListedPod(uint32_t ip) {
  Link& l = TheLink();
  std::lock_guard lock(l.mu);
  if (Open(l) != 0 || l.pods.get() == nullptr) return ff::PodListed::kUnknown;
  return ff::FindStreamPod(l.pods.get(), ip);
}

uint32_t OwnAddress() {
  Link& l = TheLink();
  std::lock_guard lock(l.mu);
  return Open(l) == 0 ? l.ip : 0;
}

void RouterLinkPrepareFork() { TheLink().mu.lock(); }
void RouterLinkParentAfterFork() { TheLink().mu.unlock(); }
void RouterLinkChildAfterFork() {
  Link& l = TheLink();
  l.sock.reset();  // the child's copy only: the parent's session goes on
  l.retry_at = 0;
  l.mu.unlock();
}

}  // namespace ff::fsocket
