#include "direct/direct_listener.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "freeflow/clock.h"
#include "freeflow/ipv4.h"
#include "freeflow/direct_stream.h"
#include "freeflow/protocol/direct_wire.h"
#include "freeflow/tunables.h"
#include "identity/netns_probe.h"
#include "spdlog/spdlog.h"

namespace ff::router {

struct DirectListeners::Candidate {
  UniqueFd fd;
  EventLoop::WatchId watch = 0;
  char frame[direct::kHelloFrameBytes] = {};
  size_t have = 0;
  uint64_t order = 0;  // accepted as the listener's order-th connection
};

struct DirectListeners::Listener {
  Expect expect;
  Done done;
  UniqueFd fd;
  EventLoop::WatchId watch = 0;
  uint64_t deadline_ns = 0;
  std::map<int, Candidate> candidates;  // by descriptor
  uint64_t accepted = 0;
};

namespace {

sockaddr_in Address(uint32_t ip, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(ip);
  a.sin_port = htons(port);
  return a;
}

// A listening socket on `ip` and the first free port of lo..hi from `start` (any port when
// the range is 0..0). 0 or an errno value.
int Listen(uint32_t ip, uint16_t lo, uint16_t hi, uint32_t start, UniqueFd* out, uint16_t* port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return errno;
  const uint32_t span = lo == 0 && hi == 0 ? 1 : static_cast<uint32_t>(hi - lo) + 1;
  for (uint32_t i = 0; i < span; ++i) {
    const auto p = static_cast<uint16_t>(span == 1 && lo == 0 ? 0 : lo + (start + i) % span);
    sockaddr_in a = Address(ip, p);
    if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      if (errno == EADDRINUSE) continue;
      return errno;
    }
    if (::listen(fd.get(), kDirectListenBacklog) != 0) return errno;
    socklen_t len = sizeof(a);
    if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0) return errno;
    *port = ntohs(a.sin_port);
    *out = std::move(fd);
    return 0;
  }
  return EADDRINUSE;
}

}  // namespace

DirectListeners::DirectListeners(Options options, EventLoop& loop)
    : options_(options), loop_(loop) {}

DirectListeners::~DirectListeners() {
  for (auto& [id, l] : listeners_) {
    loop_.Unwatch(l->watch);
    for (auto& [fd, c] : l->candidates) loop_.Unwatch(c.watch);
  }
}

int DirectListeners::Open(int netns, const Expect& expect, Done done, uint16_t* port,
                          std::string* error) {
  UniqueFd fd;
  int rc = 0;
  auto work = [&](dev_t, ino_t, std::string*) {
    rc = Listen(expect.acceptor_ip, options_.port_lo, options_.port_hi, next_port_, &fd, port);
  };
  if (netns < 0) {
    work(0, 0, nullptr);
  } else if (!RunInNamespace(netns, work, error)) {
    return EIO;
  }
  if (rc != 0) {
    *error = "cannot listen on " + FormatIpv4(expect.acceptor_ip) + " in its pod: " +
             std::strerror(rc);
    return rc;
  }
  ++next_port_;
  const uint64_t id = next_id_++;
  auto l = std::make_unique<Listener>();
  l->expect = expect;
  l->done = std::move(done);
  l->deadline_ns = MonotonicNs() + options_.timeout_ns;
  l->watch = loop_.Watch(fd.get(), EPOLLIN, [this, id](uint32_t) { OnAcceptable(id); });
  if (l->watch == 0) {
    *error = "the event loop cannot watch a direct listener";
    return ENOMEM;
  }
  l->fd = std::move(fd);
  listeners_.emplace(id, std::move(l));
  return 0;
}

void DirectListeners::OnAcceptable(uint64_t id) {
  auto it = listeners_.find(id);
  if (it == listeners_.end()) return;
  Listener& l = *it->second;
  for (int burst = 0; burst < kDirectAcceptBurst; ++burst) {  // a flood waits for the next turn
    sockaddr_in from{};
    socklen_t len = sizeof(from);
    UniqueFd c(::accept4(l.fd.get(), reinterpret_cast<sockaddr*>(&from), &len,
                         SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!c) return;  // EAGAIN, or an error the next connection may not have
    const int cfd = c.get();
    if (ntohl(from.sin_addr.s_addr) != l.expect.dialler_ip) {
      Refuse(l, -1, DirectRefusal::kAddress, "from another address");
      continue;
    }
    if (l.candidates.size() >= kDirectCandidates) {
      // The oldest gives way: connections that never speak cannot keep the right one out.
      auto oldest = l.candidates.begin();
      for (auto i = l.candidates.begin(); i != l.candidates.end(); ++i)
        if (i->second.order < oldest->second.order) oldest = i;
      Refuse(l, oldest->first, DirectRefusal::kCrowded, "that sent no hello while newer ones came");
    }
    Candidate& cand = l.candidates[cfd];
    cand.order = l.accepted++;
    cand.fd = std::move(c);
    cand.watch = loop_.Watch(cfd, EPOLLIN, [this, id, cfd](uint32_t) { OnReadable(id, cfd); });
    if (cand.watch == 0) l.candidates.erase(cfd);
  }
}

void DirectListeners::OnReadable(uint64_t id, int cand_fd) {
  auto it = listeners_.find(id);
  if (it == listeners_.end()) return;
  Listener& l = *it->second;
  auto c = l.candidates.find(cand_fd);
  if (c == l.candidates.end()) return;
  Candidate& cand = c->second;
  // Exactly the hello's bytes: whatever the dialler sent after it stays for the pod.
  const ssize_t n = ::recv(cand_fd, cand.frame + cand.have, sizeof(cand.frame) - cand.have, 0);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return;
  if (n <= 0) return Refuse(l, cand_fd, DirectRefusal::kClosed, "closed before its hello");
  cand.have += static_cast<size_t>(n);
  if (cand.have < sizeof(cand.frame)) return;
  if (!Authentic(l, cand.frame))
    return Refuse(l, cand_fd, DirectRefusal::kUnauthentic, "with a hello that does not open");
  UniqueFd conn = std::move(cand.fd);
  loop_.Unwatch(cand.watch);
  l.candidates.erase(c);
  Finish(id, std::move(conn), 0);
}

bool DirectListeners::Authentic(const Listener& l, const char (&frame)[direct::kHelloFrameBytes]) {
  direct::Hello hello;
  return OpenHello(l.expect.secret, options_.mode, frame, &hello) && hello.magic == direct::kMagic &&
         hello.version == direct::kVersion && hello.conn == l.expect.conn &&
         hello.src_ip == l.expect.dialler_ip && hello.dest_ip == l.expect.acceptor_ip;
}

void DirectListeners::Refuse(Listener& l, int cand_fd, DirectRefusal reason, const char* why) {
  refusals_.Note(reason);
  spdlog::debug("direct connection to {} refused a connection {}",
               FormatIpv4(l.expect.acceptor_ip), why);
  if (cand_fd < 0) return;  // never watched: the caller's descriptor closes
  auto c = l.candidates.find(cand_fd);
  if (c == l.candidates.end()) return;
  loop_.Unwatch(c->second.watch);
  l.candidates.erase(c);
}

void DirectListeners::Finish(uint64_t id, UniqueFd conn, int error) {
  auto it = listeners_.find(id);
  if (it == listeners_.end()) return;
  std::unique_ptr<Listener> l = std::move(it->second);
  listeners_.erase(it);
  loop_.Unwatch(l->watch);
  for (auto& [fd, c] : l->candidates) loop_.Unwatch(c.watch);
  l->done(std::move(conn), error);
}

void DirectListeners::Tick(uint64_t now_ns) {
  std::vector<uint64_t> late;
  for (const auto& [id, l] : listeners_)
    if (now_ns >= l->deadline_ns) late.push_back(id);
  for (uint64_t id : late) Finish(id, UniqueFd(), ETIMEDOUT);
}

}  // namespace ff::router
