#include "pods/pod_sessions.h"

#include <sched.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string_view>

#include "base/find.h"
#include "freeflow/ipv4.h"
#include "freeflow/target_ops.h"

namespace ff::router {
namespace {

// The ABI a HELLO of either kind names.
uint32_t AbiOf(proto::Op op, const char* buf) {
  return op == proto::Op::kHello ? proto::As<proto::Hello>(buf).abi
                                 : proto::As<proto::SockHello>(buf).abi;
}

}  // namespace

PodSessions::~PodSessions() {
  gate_.reset();  // delivers nothing more
  loop_.RemovePoller(this);
}

bool PodSessions::Listen(UniqueFd bound, std::string* error) {
  listen_ = std::move(bound);
  if (::listen(listen_.get(), kPodListenBacklog) != 0) {
    *error = std::string("listen: ") + std::strerror(errno);
    return false;
  }
  gate_ = std::make_unique<PodGate>(identity_);
  return gate_->Start(
      listen_.get(), loop_, [this](PodGate::Identified c) { Take(std::move(c)); }, error);
}

bool PodSessions::RestartGate(std::string* error) {
  gate_ = std::make_unique<PodGate>(identity_);
  return gate_->Start(
      listen_.get(), loop_, [this](PodGate::Identified c) { Take(std::move(c)); }, error);
}

void PodSessions::Adopt(UniqueFd sock) {
  if (std::optional<PodGate::Identified> c = IdentifyClient(identity_, std::move(sock)))
    Take(std::move(*c));
}

void PodSessions::Admit(Session& s, const std::string& identity_error) {
  std::string error = identity_error;
  if (!error.empty() || !AddressFree(s.who, &error)) {
    uint64_t held_back = 0;
    if (refusal_log_.Allow(&held_back))
      spdlog::warn("refusing a client: {} ({} more refused since the last line)", error, held_back);
    ++refusals_;
    if (events_ != nullptr) events_->Note(s.who.ip, "session refused", error);
    s.refusal = error;
    return;
  }
  s.refusal_error = quotas_.Open(s.id, s.who.ip);
  if (s.refusal_error != 0) {
    ++refusals_;  // the quota noted it
    s.refusal = "pod " + FormatIpv4(s.who.ip) +
                " has all the sessions or descriptors its quota allows "
                "(--max-sessions-per-pod, --max-fds-per-pod)";
  }
}

void PodSessions::Take(PodGate::Identified c) {
  auto s = std::make_unique<Session>();
  s->id = next_id_++;
  if (next_id_ == 0) next_id_ = 1;
  s->sock = std::move(c.sock);
  s->who = c.who;
  Admit(*s, c.error);
  if (!s->refusal.empty()) {
    // Keep the connection until the client's HELLO arrives, so that it reads the reason
    // as its answer instead of a reset connection; but not for too many clients at once.
    if (refused_ >= static_cast<size_t>(kMaxRefusedSessions)) return;
    ++refused_;
  }
  hello_deadlines_.emplace_back(MonotonicNs() + hello_timeout_ns_, s->id);
  const PodId id = s->id;
  WatchSocket(*s);
  if (s->refusal.empty()) {
    spdlog::info("client {} connected: pid {} address {}", id, s->who.pid, FormatIpv4(s->who.ip));
  }
  sessions_[id] = std::move(s);
}

void PodSessions::WatchSocket(Session& s) {
  const PodId id = s.id;
  s.watch = loop_.Watch(s.sock.get(), EPOLLIN | EPOLLRDHUP, [this, id](uint32_t events) {
    if (events & EPOLLIN) {
      OnReadable(id);
    } else if (events & (EPOLLHUP | EPOLLERR | EPOLLRDHUP)) {
      Drop(id, "connection closed");
    }
  });
}

// Two network namespaces are never the same pod: an address held by live sessions from
// another namespace is refused. Only a pod that took another's address, or put it in a
// namespace of its own, gets here, so it is logged as such.
bool PodSessions::AddressFree(const PodIdentity& who, std::string* error) const {
  for (const auto& [id, s] : sessions_) {
    if (!s->refusal.empty() || s->who.ip != who.ip || s->who.netns == who.netns) continue;
    spdlog::warn(
        "suspected impersonation: pid {} in network namespace {} claims {}, which client {} "
        "(pid {}, network namespace {}) holds",
        who.pid, who.netns, FormatIpv4(who.ip), id, s->who.pid, s->who.netns);
    *error = "its overlay address " + FormatIpv4(who.ip) +
             " is in use by another network namespace at this router";
    return false;
  }
  return true;
}

PodSessions::Session* PodSessions::Find(PodId id) { return FindIn(sessions_, id); }

const PodIdentity* PodSessions::Identity(PodId pod) const {
  const Session* s = FindIn(sessions_, pod);
  return s == nullptr ? nullptr : &s->who;
}

// One message a turn: the pod socket is watched level-triggered, so the loop comes back at
// once for the next. A pod that asks and then waits (the usual case) costs no second read
// that finds the socket empty, and a busy pod cannot hold the loop from the others.
void PodSessions::OnReadable(PodId id) {
  Session* s = Find(id);
  if (s == nullptr) return;
  if (s->ring_control != nullptr) return OnRingSocket(id);
  alignas(8) char buf[proto::kMaxMessage];
  UniqueFd fds[proto::kMaxFds];
  int nfds = 0;
  size_t n = 0;
  const int rc =
      RecvWithFds(s->sock.get(), buf, sizeof(buf), fds, proto::kMaxFds, &nfds, &n, MSG_DONTWAIT);
  if (rc == EAGAIN || rc == EWOULDBLOCK) return;
  if (rc != 0) return Drop(id, rc == EMSGSIZE ? "oversized message" : "receive error");
  if (n == 0) return Drop(id, "client closed the connection");
  Serve(*s, buf, n, fds, nfds);
}

bool PodSessions::Serve(Session& s, const char* buf, size_t n, UniqueFd* fds, int nfds) {
  const PodId id = s.id;
  const uint64_t remote_waits = loop_.remote_waits();
  if (!Dispatch(s, buf, n, fds, nfds)) {
    Drop(id, "malformed or unexpected message");
    return false;
  }
  if (loop_.remote_waits() == remote_waits) loop_.StayAwake(answer_spin_ns_);
  return Find(id) != nullptr;
}

// ---- request rings -------------------------------------------------------------------------

int PodSessions::TakeRing(Session& s, const proto::RequestRing& m, UniqueFd* fds, int nfds) {
  const size_t bytes = RequestRingSegmentBytes(kRequestRingBytes);
  if (s.ring_control != nullptr || m.bytes != kRequestRingBytes || nfds != 1) return EINVAL;
  // Sealed: the pod cannot shrink it under our mapping (SIGBUS).
  if (!SealedAtLeast(fds[0].get(), bytes)) return EINVAL;
  Mapping map;
  if (const int rc = MapSegment(fds[0].get(), bytes, true, &map)) return rc;
  s.ring.Attach(RequestRingOf(map.get()), kRequestRingBytes);
  if (!s.ring.sane()) return EINVAL;  // a ring must start empty and aligned
  s.ring_control = map.as<RequestRingControl>();
  s.ring_control->router_cpu.store(shown_cpu_, std::memory_order_relaxed);
  s.ring_map = std::move(map);
  ring_pods_.push_back(s.id);
  return 0;
}

namespace {

// A record of the request ring as the library writes one: its publish time, then a request
// (kRecRequest) of at least a header and at most kMaxMessage bytes, or nothing more
// (kRecOnSocket).
bool WellFormed(const RecordHeader& hdr) {
  constexpr uint32_t kAt = sizeof(uint64_t);
  if (hdr.kind == kRecOnSocket) return hdr.frag_len == kAt;
  return hdr.kind == kRecRequest && hdr.frag_len >= kAt + sizeof(proto::Header) &&
         hdr.frag_len - kAt <= static_cast<uint32_t>(proto::kMaxMessage);
}

}  // namespace

// Takes the doorbells at the head of the socket; true when a request (not a doorbell) is
// next, false when nothing is (or on an error, which the next read reports).
bool PodSessions::RequestOnSocket(Session& s) {
  for (int i = 0; i < kRingRequestsPerTurn; ++i) {
    proto::Doorbell d;
    const ssize_t n = ::recv(s.sock.get(), &d, sizeof(d), MSG_PEEK | MSG_DONTWAIT | MSG_TRUNC);
    if (n < 0) return false;
    if (n == 0) return true;  // the end: the read that follows reports it
    if (static_cast<size_t>(n) != sizeof(d) || d.h.op != proto::Op::kDoorbell) return true;
    char discard[sizeof(d)];
    if (::recv(s.sock.get(), discard, sizeof(discard), MSG_DONTWAIT) != sizeof(discard))
      return false;
  }
  return false;  // a pod that only rings: the rest next turn (its socket stays readable)
}

RingStatus PodSessions::RingHead(Session& s, Head* head) {
  const RingStatus st = s.ring.Peek(&head->hdr, &head->payload);
  if (st != RingStatus::kOk) return st;
  if (!WellFormed(head->hdr)) return RingStatus::kCorrupt;
  std::memcpy(&head->at, head->payload, sizeof(head->at));
  if (head->hdr.kind == kRecOnSocket && !RequestOnSocket(s)) return RingStatus::kEmpty;
  return RingStatus::kOk;
}

// Serves `head`, the record RingHead found (and checked) at the head of `s`'s ring: its copy
// of the record's header is the one used, whatever the pod wrote there since. false: the
// session is gone.
bool PodSessions::ServeHead(Session& s, const Head& head) {
  const PodId id = s.id;
  alignas(8) char buf[proto::kMaxMessage];
  UniqueFd fds[proto::kMaxFds];
  int nfds = 0;
  size_t n = 0;
  if (head.hdr.kind == kRecRequest) {
    n = head.hdr.frag_len - sizeof(uint64_t);
    // Ours before it is decoded: the pod may write the ring meanwhile.
    std::memcpy(buf, head.payload + sizeof(uint64_t), n);
  } else {
    const int rc =
        RecvWithFds(s.sock.get(), buf, sizeof(buf), fds, proto::kMaxFds, &nfds, &n, MSG_DONTWAIT);
    if (rc != 0 || n == 0) {
      Drop(id, rc == 0 ? "client closed the connection" : "receive error");
      return false;
    }
  }
  s.ring.Consume(head.hdr);
  // Released once served: a library that sees its record released knows the router did
  // what it asked (a destroyed QP is gone: its segment can be reused, verbs-library.md).
  if (!Serve(s, buf, n, fds, nfds)) return false;
  s.ring.Release();  // Serve found it alive (ids are never reused)
  return true;
}

// Tells the rings' libraries which CPU the router runs on (RequestRingControl::router_cpu),
// when that changed.
void PodSessions::ShowCpu() {
  const int cpu = ::sched_getcpu();
  const uint32_t shown = cpu < 0 ? 0 : static_cast<uint32_t>(cpu) + 1;
  if (shown == shown_cpu_) return;
  shown_cpu_ = shown;
  for (PodId id : ring_pods_)
    Find(id)->ring_control->router_cpu.store(shown, std::memory_order_relaxed);
}

// Serves every ring, oldest request first across them: a request one pod published before
// another pod's (which may depend on it: a QP the other connects to) is served first.
void PodSessions::Poll() {
  if (ring_pods_.empty()) return;
  ShowCpu();
  polling_ = ring_pods_;  // serving may drop sessions (and so change ring_pods_)
  served_.assign(polling_.size(), 0);
  for (;;) {
    size_t pick = polling_.size();
    Head oldest;
    for (size_t i = 0; i < polling_.size(); ++i) {
      Session* s = served_[i] < kRingRequestsPerTurn ? Find(polling_[i]) : nullptr;
      if (s == nullptr) continue;
      Head head;
      const RingStatus st = RingHead(*s, &head);
      if (st == RingStatus::kCorrupt) {
        Drop(polling_[i], "malformed request ring");
        continue;
      }
      if (st == RingStatus::kOk && (pick == polling_.size() || head.at < oldest.at)) {
        pick = i;
        oldest = head;
      }
    }
    if (pick == polling_.size()) return;
    ++served_[pick];
    if (Session* s = Find(polling_[pick])) ServeHead(*s, oldest);
  }
}

// The socket of a session with a ring: its requests are served in the rings' order (Poll);
// what else is on it must be doorbells, or requests whose places are in the ring.
void PodSessions::OnRingSocket(PodId id) {
  Poll();
  Session* s = Find(id);
  if (s == nullptr) return;
  if (!RequestOnSocket(*s)) return;  // doorbells only (taken), or nothing
  RecordHeader hdr;
  const char* payload = nullptr;
  if (s->ring.Peek(&hdr, &payload) != RingStatus::kEmpty) return;  // served in a later turn
  char probe;
  if (::recv(s->sock.get(), &probe, 1, MSG_PEEK | MSG_DONTWAIT) == 0)
    return Drop(id, "client closed the connection");
  Drop(id, "a request on the socket without its place in the request ring");
}

bool PodSessions::Arm() {
  for (PodId id : ring_pods_) Find(id)->ring_control->sleeping.store(1, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  for (PodId id : ring_pods_) {
    Head head;
    // A request whose place is held but which is not on the socket yet wakes us when it
    // comes (RingHead answers kEmpty for it); a corrupt ring is dropped by the next Poll.
    if (RingHead(*Find(id), &head) != RingStatus::kEmpty) return true;
  }
  return false;
}

void PodSessions::Disarm() {
  for (PodId id : ring_pods_) Find(id)->ring_control->sleeping.store(0, std::memory_order_relaxed);
}

bool PodSessions::Dispatch(Session& s, const char* buf, size_t len, UniqueFd* fds, int nfds) {
  proto::Op op;
  if (!proto::DecodeRequest(buf, len, nfds, &op)) return false;
  // One HELLO (of either kind) first, then only requests of the session's kind.
  const bool hello = op == proto::Op::kHello || op == proto::Op::kSockHello;
  if (s.welcomed == hello) return false;
  if (s.welcomed && proto::IsSocketOp(op) != (s.kind == Kind::kSocket)) return false;
  const Call call{s.id, op, proto::As<proto::Header>(buf).seq};
  if (!s.refusal.empty()) {
    proto::Response r{};
    std::snprintf(r.u.hello.node, sizeof(r.u.hello.node), "%s", s.refusal.c_str());
    Send(call, s.refusal_error, r, nullptr, 0);
    return false;
  }
  if (hello && AbiOf(op, buf) != kAbiVersion) {  // the library may try again
    proto::Response r{};
    std::snprintf(r.u.hello.node, sizeof(r.u.hello.node),
                  "library ABI %u does not match router ABI %u", AbiOf(op, buf), kAbiVersion);
    Send(call, EPROTO, r, nullptr, 0);
    return true;
  }
  if (op == proto::Op::kDoorbell) return true;  // nothing to serve but the ring
  if (op == proto::Op::kRequestRing) {
    Send(call, TakeRing(s, proto::As<proto::RequestRing>(buf), fds, nfds), proto::Response{},
         nullptr, 0);
    return true;
  }
  if (op == proto::Op::kTrafficLedger) {
    const auto m = proto::As<proto::TrafficLedger>(buf);
    int rc = m.bytes == kTrafficLedgerBytes ? s.traffic.Take(fds[0].get(), MonotonicNs()) : EINVAL;
    if (rc != 0) claim_refusals_.Note(ClaimRefusal::kLedger);
    Send(call, rc, proto::Response{}, nullptr, 0);
    return true;
  }
  // Answer() gives the charge back: only requests answered later keep it.
  if (const int rc = quotas_.Take(s.id, {{Quota::kPending, 1}})) {
    Send(call, rc, proto::Response{}, nullptr, 0);
    return true;
  }
  return handler_.OnRequest(call, buf, fds, nfds);
}

void PodSessions::Welcome(PodId pod, UniqueFd events, Kind kind) {
  Session* s = Find(pod);
  if (s == nullptr) return;
  s->welcomed = true;
  s->kind = kind;
  s->events = std::move(events);
}

int PodSessions::SocketOf(PodId pod) const {
  const Session* s = FindIn(sessions_, pod);
  return s == nullptr ? -1 : s->sock.get();
}

void PodSessions::Answer(const Call& call, int status, const proto::Response& body, const int* fds,
                         int nfds) {
  quotas_.Give(call.pod, {{Quota::kPending, 1}});
  Send(call, status, body, fds, nfds);
}

void PodSessions::Send(const Call& call, int status, const proto::Response& body, const int* fds,
                       int nfds) {
  Session* s = Find(call.pod);
  if (s == nullptr) return;
  if (status != 0) ++errors_[{static_cast<uint32_t>(call.op), status}];
  if (call.seq == proto::kPostedSeq) {  // the library does not wait for this one
    if (status != 0)
      spdlog::debug("client {}: posted request (op {}) failed: {}", call.pod,
                    static_cast<uint32_t>(call.op), std::strerror(status));
    return;
  }
  proto::Response r = body;
  r.h.op = call.op;
  r.h.seq = call.seq;
  r.status = status;
  if (SendWithFds(s->sock.get(), &r, sizeof(r), fds, nfds, MSG_DONTWAIT) != 0) {
    // It stopped reading (or is gone): drop it, but not from inside the caller's work.
    const PodId id = call.pod;
    loop_.Defer([this, id] { Drop(id, "does not take its answers"); });
  }
}

void PodSessions::Notify(PodId pod, proto::EventType type, uint32_t qpn) {
  proto::Event e{};
  e.type = type;
  e.qpn = qpn;
  NotifyWithFd(pod, e, -1);
}

void PodSessions::NotifyWithFd(PodId pod, const proto::Event& e, int fd) {
  Session* s = Find(pod);
  if (s == nullptr || !s->events) return;
  if (s->backlog.empty()) {  // else those go first
    const int rc =
        SendWithFds(s->events.get(), &e, sizeof(e), &fd, fd >= 0 ? 1 : 0, MSG_DONTWAIT);
    if (rc == 0) return;
    if (rc != EAGAIN && rc != EWOULDBLOCK) return LoseEvents(*s, std::strerror(rc));
  }
  if (!QueueEvent(*s, e, fd)) {
    return LoseEvents(*s, "it does not read its events (" + std::to_string(s->backlog.size()) +
                              " waiting, holding " + std::to_string(s->backlog.fds()) +
                              " descriptors)");
  }
  if (s->events_watch == 0) {
    const PodId id = s->id;
    s->events_watch =
        loop_.Watch(s->events.get(), EPOLLOUT, [this, id](uint32_t) { OnEventsWritable(id); });
    if (s->events_watch == 0) LoseEvents(*s, "cannot watch its event socket");
  }
}

bool PodSessions::QueueEvent(Session& s, const proto::Event& e, int fd) {
  // The most it can hold more; what a replaced event held is given back after.
  if (!quotas_.TryTake(s.id, {Quota::kQueuedBytes, sizeof(e)})) return false;
  s.charged_event_bytes += sizeof(e);
  if (fd >= 0) {
    if (!quotas_.TryTake(s.id, {Quota::kFds, 1})) {
      SettleEventCharges(s);
      return false;
    }
    ++s.charged_event_fds;
  }
  const uint64_t replaced = s.backlog.replaced();
  const bool queued = s.backlog.Push(e, fd);
  events_replaced_ += s.backlog.replaced() - replaced;
  SettleEventCharges(s);
  return queued;
}

void PodSessions::SettleEventCharges(Session& s) {
  const uint64_t bytes = s.backlog.size() * sizeof(proto::Event), fds = s.backlog.fds();
  if (s.charged_event_bytes > bytes) {
    quotas_.Give(s.id, {{Quota::kQueuedBytes, s.charged_event_bytes - bytes}});
    s.charged_event_bytes = bytes;
  }
  if (s.charged_event_fds > fds) {
    quotas_.Give(s.id, {{Quota::kFds, s.charged_event_fds - fds}});
    s.charged_event_fds = fds;
  }
}

void PodSessions::OnEventsWritable(PodId id) {
  Session* s = Find(id);
  if (s == nullptr || !s->events) return;
  const int rc = s->backlog.Flush(s->events.get());
  SettleEventCharges(*s);
  if (rc == EAGAIN) return;
  if (rc != 0) return LoseEvents(*s, std::strerror(rc));
  loop_.Unwatch(s->events_watch);
  s->events_watch = 0;
}

void PodSessions::LoseEvents(Session& s, const std::string& why) {
  spdlog::warn("client {}: dropping its event socket: {}", s.id, why);
  if (s.events_watch != 0) loop_.Unwatch(s.events_watch);
  s.events_watch = 0;
  s.backlog = EventBacklog();
  SettleEventCharges(s);
  s.events.reset();
}

size_t PodSessions::events_waiting() const {
  size_t n = 0;
  for (const auto& [id, s] : sessions_) n += s->backlog.size();
  return n;
}

void PodSessions::ReadTraffic() {
  if (traffic_sink_ == nullptr) return;
  const uint64_t now = MonotonicNs();
  for (auto& [id, s] : sessions_) s->traffic.Read(now, *traffic_sink_, claim_refusals_);
}

size_t PodSessions::ledgers() const {
  size_t n = 0;
  for (const auto& [id, s] : sessions_) n += s->traffic.taken() ? 1 : 0;
  return n;
}

void PodSessions::NotifyAll(proto::EventType type) {
  for (auto& [id, s] : sessions_) Notify(id, type, 0);
}

void PodSessions::Drop(PodId pod, const char* why) {
  auto it = sessions_.find(pod);
  if (it == sessions_.end()) return;
  std::unique_ptr<Session> s = std::move(it->second);
  sessions_.erase(it);
  if (s->ring_control != nullptr)
    ring_pods_.erase(std::remove(ring_pods_.begin(), ring_pods_.end(), pod), ring_pods_.end());
  loop_.Unwatch(s->watch);
  if (s->events_watch != 0) loop_.Unwatch(s->events_watch);
  if (!s->refusal.empty()) --refused_;
  ++ends_[why];
  // A pod that broke the protocol (not one that closed, or was refused): the admin's too.
  const std::string_view reason(why);
  if (events_ != nullptr && s->refusal.empty() && reason != "connection closed" &&
      reason != "client closed the connection")
    events_->Note(s->who.ip, "session dropped", why);
  spdlog::info("client {} (pid {}, {}) gone: {}", pod, s->who.pid, FormatIpv4(s->who.ip), why);
  if (traffic_sink_ != nullptr) s->traffic.Read(MonotonicNs(), *traffic_sink_, claim_refusals_);
  handler_.OnPodGone(pod);
  quotas_.Close(pod);
  s.reset();
}

void PodSessions::Sweep() {
  const uint64_t now = MonotonicNs();
  while (!hello_deadlines_.empty() && hello_deadlines_.front().first <= now) {
    const PodId id = hello_deadlines_.front().second;
    hello_deadlines_.pop_front();
    const Session* s = Find(id);
    if (s != nullptr && !s->welcomed) Drop(id, "no HELLO in time");
  }
}

}  // namespace ff::router
