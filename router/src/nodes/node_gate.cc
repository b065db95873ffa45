#include "nodes/node_gate.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <spdlog/spdlog.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>

#include "base/find.h"
#include "freeflow/clock.h"
#include "freeflow/ipv4.h"
#include "freeflow/tunables.h"

namespace ff::router {
namespace {

// The gate yields to the thread that serves pods and ready links when both want a CPU.
constexpr int kGateNice = 10;
constexpr uint64_t kGateTickNs = 100'000'000;

}  // namespace

NodeGate::~NodeGate() {
  if (thread_.joinable()) {
    loop_.Stop();
    thread_.join();
  }
  acceptor_.Stop();
  for (auto& [id, p] : pending_) loop_.Unwatch(p->watch);
}

bool NodeGate::Start(OnAdmitted on_admitted, std::string* error) {
  on_admitted_ = std::move(on_admitted);
  const std::string where = FormatIpv4(options_.host_ip) + ":" + std::to_string(options_.port);
  listen_.reset(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  int one = 1;
  if (listen_) ::setsockopt(listen_.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(options_.port);
  a.sin_addr.s_addr = htonl(options_.host_ip);
  if (!listen_ || ::bind(listen_.get(), reinterpret_cast<const sockaddr*>(&a), sizeof(a)) != 0 ||
      ::listen(listen_.get(), kNodeListenBacklog) != 0) {
    *error = "cannot listen for routers on " + where + ": " + std::strerror(errno);
    return false;
  }
  sockaddr_in bound{};
  socklen_t len = sizeof(bound);
  if (::getsockname(listen_.get(), reinterpret_cast<sockaddr*>(&bound), &len) == 0)
    options_.port = ntohs(bound.sin_port);
  int err = loop_.Init();
  if (err == 0) {
    err = acceptor_.Start(loop_, listen_.get(), kNodeAcceptBurst, "router port " + where,
                          [this](UniqueFd fd) { OnAccepted(std::move(fd)); });
  }
  if (err == 0) err = tick_.Start(loop_, [this] { OnTick(); });
  if (err != 0) {
    *error = std::string("cannot watch the router port: ") + std::strerror(err);
    return false;
  }
  tick_.Arm(kGateTickNs);
  thread_ = std::thread([this] { Run(); });
  return true;
}

void NodeGate::Run() {
  ::pthread_setname_np(::pthread_self(), "ffr-node-gate");
  // Per thread on Linux: the gate's thread only.
  ::setpriority(PRIO_PROCESS, static_cast<id_t>(::gettid()), kGateNice);
  while (!loop_.stopped()) loop_.RunOnce(-1);
}

std::string NodeGate::last_refusal() const {
  std::lock_guard<std::mutex> lock(last_mu_);
  return last_refusal_;
}

void NodeGate::OnAccepted(UniqueFd fd) {
  sockaddr_in peer{};
  socklen_t len = sizeof(peer);
  if (::getpeername(fd.get(), reinterpret_cast<sockaddr*>(&peer), &len) != 0) return;  // gone
  const uint32_t source = ntohl(peer.sin_addr.s_addr);
  MakeRoom(source);
  int one = 1;
  ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  auto p = std::make_unique<Pending>();
  p->id = next_id_++;
  p->fd = std::move(fd);
  p->source_ip = source;
  p->created_ns = MonotonicNs();
  if (options_.tls != nullptr) {
    p->tls = TlsSession::Create(*options_.tls, p->fd.get(), false);
    if (p->tls == nullptr) return;
  } else {
    p->secured = true;
  }
  p->events = EPOLLIN | EPOLLRDHUP;
  const uint64_t id = p->id;
  p->watch = loop_.Watch(p->fd.get(), p->events, [this, id](uint32_t) { Advance(id); });
  if (p->watch == 0) return;
  pending_.emplace(id, std::move(p));
  waiting_.store(pending_.size());
}

int NodeGate::Progress(const Pending& p) const {
  if (p.got > 0 || (p.tls != nullptr && p.tls->Started())) return 2;
  int unread = 0;
  return ::ioctl(p.fd.get(), FIONREAD, &unread) == 0 && unread > 0 ? 1 : 0;
}

void NodeGate::MakeRoom(uint32_t source) {
  std::unordered_map<uint32_t, size_t> per_source;
  for (const auto& [id, p] : pending_) ++per_source[p->source_ip];
  const bool source_full = per_source[source] >= kMaxPendingNodeLinksPerSource;
  if (!source_full && pending_.size() < kMaxPendingNodeLinks) return;
  struct Candidate {
    const Pending* p;
    size_t from_source;
    int progress;
  };
  const auto before = [](const Candidate& a, const Candidate& b) {  // a is closed first
    if (a.from_source != b.from_source) return a.from_source > b.from_source;
    if (a.progress != b.progress) return a.progress < b.progress;
    if (a.p->created_ns != b.p->created_ns) return a.p->created_ns < b.p->created_ns;
    return a.p->id < b.p->id;
  };
  std::optional<Candidate> victim;
  for (const auto& [id, p] : pending_) {
    if (p->tls != nullptr && p->secured) continue;  // holds a cluster certificate
    if (source_full && p->source_ip != source) continue;
    const Candidate c{p.get(), per_source[p->source_ip], Progress(*p)};
    if (!victim || before(c, *victim)) victim = c;
  }
  if (!victim) return;  // all of them hold a certificate: bounded by time
  ++evicted_;
  uint64_t held_back = 0;
  if (evict_log_.Allow(&held_back)) {
    spdlog::warn(
        "router port: closing connections that have not authenticated for newer ones, "
        "now one from {} ({} waiting, {} from that address; {} closed so in all)",
        FormatIpv4(victim->p->source_ip), pending_.size(), victim->from_source, evicted_);
  }
  Refuse(victim->p->id, GateRefusal::kCrowded,
         "closed for a newer connection before it authenticated");
}

void NodeGate::Advance(uint64_t id) {
  Pending* p = FindIn(pending_, id);
  if (p == nullptr) return;
  if (!p->secured) {
    std::string error;
    switch (p->tls->Handshake(&error)) {
      case TlsStatus::kWantRead:
      case TlsStatus::kWantWrite:
        p->wants_write = p->tls->HasUnsent();
        Sync(*p);
        return;
      case TlsStatus::kFailed:
        return Refuse(id, GateRefusal::kTls, error);
      case TlsStatus::kDone:
        p->secured = true;
        p->wants_write = false;
        break;
    }
  }
  if (!ReadHello(*p)) return;
  wire::Hello m;
  std::memcpy(&m, p->hello + sizeof(wire::FrameHeader), sizeof(m));
  if (m.magic != wire::kMagic || m.version != wire::kVersion) {
    return Refuse(id, GateRefusal::kVersion,
                  "peer router speaks wire version " + std::to_string(m.version) + ", this one " +
                      std::to_string(wire::kVersion));
  }
  m.node[sizeof(m.node) - 1] = '\0';
  if (p->tls != nullptr && !p->tls->PeerIs(m.node)) {
    return Refuse(id, GateRefusal::kIdentity,
                  "peer router says it is node '" + std::string(m.node) +
                      "' but its certificate is " + p->tls->PeerSubject());
  }
  Admit(*p, m.node);
}

// Reads the hello frame and nothing after it (plaintext: what follows stays in the socket;
// TLS: in the session, which goes with the link).
bool NodeGate::ReadHello(Pending& p) {
  const uint64_t id = p.id;
  while (p.got < sizeof(p.hello)) {
    bool want_write = false;
    char* at = p.hello + p.got;
    const size_t want = sizeof(p.hello) - p.got;
    const ssize_t n = p.tls != nullptr ? p.tls->Read(at, want, &want_write)
                                       : ::recv(p.fd.get(), at, want, MSG_DONTWAIT);
    if (n == 0) {
      Refuse(id, GateRefusal::kClosed, "peer router closed the connection");
      return false;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        p.wants_write = want_write;
        Sync(p);
        return false;
      }
      Refuse(id, GateRefusal::kClosed, std::strerror(errno));
      return false;
    }
    const bool had_header = p.got >= sizeof(wire::FrameHeader);
    p.got += static_cast<size_t>(n);
    if (had_header || p.got < sizeof(wire::FrameHeader)) continue;
    wire::FrameHeader h;
    std::memcpy(&h, p.hello, sizeof(h));
    if (!wire::ValidFrame(h)) {
      Refuse(id, GateRefusal::kMalformed, "malformed frame from peer router");
      return false;
    }
    if (h.type != wire::Type::kHello) {
      Refuse(id, GateRefusal::kMalformed,
             "peer router sent a message before saying which node it is");
      return false;
    }
  }
  return true;
}

void NodeGate::Admit(Pending& p, const std::string& node) {
  loop_.Unwatch(p.watch);
  Admitted a{std::move(p.fd), std::move(p.tls), node, p.source_ip};
  pending_.erase(p.id);
  waiting_.store(pending_.size());
  acceptor_.Resume();
  on_admitted_(std::move(a));
}

void NodeGate::Refuse(uint64_t id, GateRefusal reason, const std::string& why) {
  auto it = pending_.find(id);
  if (it == pending_.end()) return;
  Pending& p = *it->second;
  refusals_.Note(reason);
  {
    std::lock_guard<std::mutex> lock(last_mu_);
    last_refusal_ = why;
  }
  // Anyone on the node network can make this line.
  uint64_t held_back = 0;
  if (refuse_log_.Allow(&held_back)) {
    spdlog::warn(
        "router port: connection from {} closed before it authenticated: {} ({} more "
        "since the last line)",
        FormatIpv4(p.source_ip), why, held_back);
  }
  loop_.Unwatch(p.watch);
  pending_.erase(it);
  waiting_.store(pending_.size());
  acceptor_.Resume();  // a descriptor was closed
}

void NodeGate::Sync(Pending& p) {
  const bool out = p.wants_write || (p.tls != nullptr && p.tls->HasUnsent());
  const uint32_t want = EPOLLIN | EPOLLRDHUP | (out ? static_cast<uint32_t>(EPOLLOUT) : 0u);
  if (want == p.events) return;
  p.events = want;
  loop_.Modify(p.watch, want);
}

void NodeGate::OnTick() {
  const uint64_t now = MonotonicNs();
  std::vector<std::pair<uint64_t, const char*>> late;
  for (const auto& [id, p] : pending_) {
    if (now - p->created_ns <= kDialTimeoutNs) continue;
    late.emplace_back(id, p->secured ? "no hello from the peer router in time"
                                     : "TLS handshake not finished in time");
  }
  for (const auto& [id, why] : late) Refuse(id, GateRefusal::kTimeout, why);
  acceptor_.Resume();
  tick_.Arm(kGateTickNs);
}

}  // namespace ff::router
