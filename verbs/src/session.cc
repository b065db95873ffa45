// The process's connection to the router: HELLO, synchronous requests, and the event
// thread that turns router notifications (peer gone, router gone) into flags.
#include <arpa/inet.h>
#include <poll.h>
#include <stdarg.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "registry.h"

namespace ffv {

namespace {

bool DebugEnabled() {
  static const bool on = [] {
    const char* v = std::getenv("FFV_LOG");
    return v != nullptr && std::strcmp(v, "debug") == 0;
  }();
  return on;
}

void VLog(const char* level, const char* fmt, va_list ap) {
  const int saved = errno;
  char line[512];
  const int n = std::vsnprintf(line, sizeof(line), fmt, ap);
  if (n > 0) std::fprintf(stderr, "freeflow %s: %s\n", level, line);
  errno = saved;
}

std::mutex g_session_mu;
Session* g_session = nullptr;

std::string EnvOr(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : fallback;
}

void EventLoop(Session* s) {
  for (;;) {
    ff::proto::Event ev{};
    const ssize_t n = ::recv(s->events.get(), &ev, sizeof(ev), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n == static_cast<ssize_t>(sizeof(ev)) && (ev.type == ff::proto::EventType::kPeerGone ||
                                                  ev.type == ff::proto::EventType::kPeerClosed)) {
      Registry::Get().OnPeerGone(ev.qpn, ev.type == ff::proto::EventType::kPeerGone);
      continue;
    }
    if (n == static_cast<ssize_t>(sizeof(ev)) && ev.type != ff::proto::EventType::kShutdown) {
      continue;  // an event this library does not know: ignore it
    }
    // Router stopped or died: nothing can be set up any more and peers can no longer be
    // watched. Fail every QP so that nobody waits forever.
    LogError("lost the connection to the router at %s; failing all queue pairs",
             s->socket_path.c_str());
    s->fatal.store(true);
    Registry::Get().OnFatal();
    return;
  }
}

Session* Connect() {
  const std::string dir = EnvOr("FREEFLOW_DIR", "/freeflow");
  const std::string name = EnvOr("FFR_NAME", "ffrouter");
  const std::string path = dir + "/" + name + ".sock";
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    LogError("router socket path %s is too long", path.c_str());
    return nullptr;
  }
  UniqueFd sock(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!sock) return nullptr;
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  if (::connect(sock.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    LogError("no virtual RDMA device: cannot reach the router at %s: %s (is ffrouter running "
             "and the host folder mounted? FFR_NAME / FREEFLOW_DIR choose the router)",
             path.c_str(), std::strerror(errno));
    return nullptr;
  }
  // A router that stops answering must turn into an error, not a hang.
  timeval tv{10, 0};
  ::setsockopt(sock.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));

  auto s = std::make_unique<Session>();
  s->socket_path = path;
  s->sock = std::move(sock);
  int rc = ff::CreateSegment("ffverbs-notify", ff::kNotifySegmentBytes, &s->notify_fd);
  if (rc == 0) rc = ff::MapSegment(s->notify_fd.get(), ff::kNotifySegmentBytes, true, &s->notify);
  int pair[2];
  if (rc == 0 && ::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) rc = errno;
  if (rc != 0) {
    LogError("cannot set up shared memory for the router: %s", std::strerror(rc));
    return nullptr;
  }
  s->events.reset(pair[0]);
  UniqueFd theirs(pair[1]);
  s->wake_fd.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!s->wake_fd) {
    LogError("cannot create an eventfd: %s", std::strerror(errno));
    return nullptr;
  }

  ff::proto::Hello hello{};
  hello.h.op = ff::proto::Op::kHello;
  hello.abi = ff::kAbiVersion;
  const int fds[3] = {s->notify_fd.get(), theirs.get(), s->wake_fd.get()};
  ff::proto::Response resp{};
  UniqueFd table;
  int got = 0;
  rc = s->Call(&hello, sizeof(hello), fds, 3, &resp, &table, 1, &got);
  theirs.reset();
  if (rc != 0) {
    resp.u.hello.node[sizeof(resp.u.hello.node) - 1] = '\0';
    LogError("the router at %s refused this process: %s%s%s", path.c_str(), std::strerror(rc),
             resp.u.hello.node[0] ? ": " : "", resp.u.hello.node);
    return nullptr;
  }
  if (got != 1 || ff::MapPeerSegment(table.get(), ff::kMrTableBytes, false, &s->mr_table) != 0) {
    LogError("the router sent a malformed HELLO answer");
    return nullptr;
  }
  resp.u.hello.node[sizeof(resp.u.hello.node) - 1] = '\0';
  s->ctx_id = resp.u.hello.ctx_id;
  s->ip = ntohl(resp.u.hello.ip);
  s->lid = resp.u.hello.lid;
  s->node = resp.u.hello.node;
  Session* raw = s.release();
  raw->event_thread = std::thread(EventLoop, raw);
  raw->event_thread.detach();
  LogDebug("connected to %s as context %u", path.c_str(), raw->ctx_id);
  return raw;
}

}  // namespace

void LogError(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  VLog("error", fmt, ap);
  va_end(ap);
}

void LogDebug(const char* fmt, ...) {
  if (!DebugEnabled()) return;
  va_list ap;
  va_start(ap, fmt);
  VLog("debug", fmt, ap);
  va_end(ap);
}

Session* GetSession() {
  std::lock_guard<std::mutex> g(g_session_mu);
  if (g_session == nullptr) g_session = Connect();
  return g_session;
}

int Session::Call(const void* req, size_t len, const int* fds, int nfds,
                  ff::proto::Response* resp, UniqueFd* fds_out, int max_fds_out, int* nfds_out) {
  std::lock_guard<std::mutex> g(call_mu);
  if (fatal.load()) return ENOTCONN;
  char buf[ff::proto::kMaxMessage];
  if (len > sizeof(buf)) return EINVAL;
  std::memcpy(buf, req, len);
  auto* h = reinterpret_cast<ff::proto::Header*>(buf);
  h->seq = ++seq;
  int rc = ff::SendWithFds(sock.get(), buf, len, fds, nfds);
  if (rc != 0) return rc == EPIPE ? ENOTCONN : rc;
  UniqueFd scratch[ff::proto::kMaxFds];
  int got = 0;
  size_t n = 0;
  rc = ff::RecvWithFds(sock.get(), resp, sizeof(*resp), scratch, ff::proto::kMaxFds, &got, &n);
  if (rc != 0) return rc == EAGAIN ? ETIMEDOUT : rc;
  if (n == 0) return ENOTCONN;
  if (n != sizeof(*resp) || resp->h.seq != h->seq || resp->h.op != h->op) return EPROTO;
  if (nfds_out != nullptr) *nfds_out = 0;
  for (int i = 0; i < got && i < max_fds_out; ++i) {
    fds_out[i] = std::move(scratch[i]);
    if (nfds_out != nullptr) ++*nfds_out;
  }
  return resp->status;
}

}  // namespace ffv
