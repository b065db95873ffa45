#include "router_link.h"

#include <arpa/inet.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "freeflow/clock.h"
#include "freeflow/router_socket.h"
#include "freeflow/stream_claims.h"
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
  ff::Mapping claims;       // this pod's claims table (stream_claims.h), read-only; or nothing
  uint64_t alive_at = 0;    // when the session last showed it was open
};
std::atomic<pid_t> g_pid{0};

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

void MapTables(Link& l, int list_fd, int claims_fd);

// Opens the session if this process has none (or inherited its parent's); caller holds mu.
int Open(Link& l) {
  const pid_t me = ProcessId();
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
  ff::UniqueFd tables[2];  // [pod list, claims table]
  int rc = Exchange(l, &hello, sizeof(hello), &status, &r, tables, 2, &nfds);
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
  l.alive_at = ff::MonotonicNs();
  ++l.generation;
  MapTables(l, nfds >= 1 ? tables[0].get() : -1, nfds >= 2 ? tables[1].get() : -1);
  return 0;
}

// A table the router shares read-only, `bytes` long, whose first words are a header with
// `magic` at offset 4; an empty Mapping when it is not that.
ff::Mapping MapTable(int fd, uint64_t bytes, uint32_t magic, const char* what) {
  if (fd < 0) return ff::Mapping();
  // Read-only for every holder, and never shorter than what is mapped: a memfd sealed against
  // writes, or a file of the router's tmpfs on a read-only mount (ABI 22).
  if (!ff::SealedReadOnly(fd) && !ff::ReadOnlyView(fd, bytes)) {
    LogError("the router's %s is not read-only for every holder: not used", what);
    return ff::Mapping();
  }
  ff::Mapping m;
  if (ff::MapRouterTable(fd, bytes, &m) != 0) return ff::Mapping();
  uint32_t found = 0;
  std::memcpy(&found, static_cast<const char*>(m.get()) + 4, sizeof(found));
  return found == magic ? std::move(m) : ff::Mapping();
}

// Maps the tables a session came with; without a usable pod list every connection asks,
// without a claims table every accepted one.
void MapTables(Link& l, int list_fd, int claims_fd) {
  static_assert(offsetof(ff::StreamPodsHeader, magic) == 4);
  static_assert(offsetof(ff::StreamClaimsHeader, magic) == 4);
  l.pods = MapTable(list_fd, ff::kStreamPodsBytes, ff::kStreamPodsMagic, "pod list");
  l.claims = MapTable(claims_fd, ff::kStreamClaimsBytes, ff::kStreamClaimsMagic, "claims table");
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
  const bool had_session = l.sock && l.pid == ProcessId();
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
  if (!l.sock || l.pid != ProcessId()) return ENOTCONN;  // nothing to tell a new session
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

ff::PodListed AcceptedFrom(uint32_t client_ip, uint16_t client_port, uint16_t server_port) {
  Link& l = TheLink();
  std::lock_guard lock(l.mu);
  if (Open(l) != 0) return ff::PodListed::kUnknown;
  const bool unlisted =
      l.pods.get() != nullptr && ff::FindStreamPod(l.pods.get(), client_ip) == ff::PodListed::kNo;
  const bool unclaimed =
      l.claims.get() != nullptr &&
      ff::FindStreamClaim(l.claims.get(), ff::StreamClaimKey(client_ip, client_port,
                                                             server_port)) == ff::PodListed::kNo;
  if (!unlisted && !unclaimed) return ff::PodListed::kUnknown;
  // The tables are only as fresh as the router that writes them: a router that replaced it
  // (this session is then closed) makes records its own tables show. The session never has
  // anything to read between calls, so readable means gone. Looked at once in
  // kSockTableTrustNs: a successor starts and takes registrations far later than that after
  // its predecessor died (docs/tcp-mode.md, "Short connections"), and a router that stops
  // cleanly marks its tables as being rewritten for good first.
  const uint64_t now = ff::MonotonicNs();
  if (now - l.alive_at > ff::kSockTableTrustNs) {
    pollfd p{l.sock.get(), POLLIN, 0};
    if (real::poll(&p, 1, 0) != 0) {
      LogDebug("router session gone: opening another at the next call");
      l.sock.reset();
      l.retry_at = 0;
      return ff::PodListed::kUnknown;
    }
    l.alive_at = now;
  }
  return ff::PodListed::kNo;
}

uint32_t OwnAddress() {
  Link& l = TheLink();
  std::lock_guard lock(l.mu);
  return Open(l) == 0 ? l.ip : 0;
}

pid_t ProcessId() {
  pid_t p = g_pid.load(std::memory_order_relaxed);
  if (p == 0) {
    p = ::getpid();
    g_pid.store(p, std::memory_order_relaxed);
  }
  return p;
}

void RouterLinkPrepareFork() { TheLink().mu.lock(); }
void RouterLinkParentAfterFork() { TheLink().mu.unlock(); }
void RouterLinkChildAfterFork() {
  g_pid.store(::getpid(), std::memory_order_relaxed);
  Link& l = TheLink();
  l.sock.reset();  // the child's copy only: the parent's session goes on
  l.retry_at = 0;
  l.mu.unlock();
}

}  // namespace ff::fsocket
