#include "session/peer_events.h"

#include <algorithm>

#include "base/exports.h"
#include "datapath/completion.h"
#include "datapath/link.h"
#include "datapath/recv_path.h"
#include "datapath/send_queue.h"
#include "session/session.h"

namespace ff::verbs {
namespace {

void WakeQpCqs(Qp* qp) {
  if (qp->scq != nullptr) NudgeCq(qp->scq);
  if (qp->rcq != nullptr && qp->rcq != qp->scq) NudgeCq(qp->rcq);
}

void FailPeerless(Context* ctx, Qp* qp) {
  MoveToError(qp, IBV_WC_RETRY_EXC_ERR);
  PushAsyncEvent(ctx, IBV_EVENT_QP_FATAL, &qp->qpx.qp_base);
}

}  // namespace

void Registry::AddContext(Context* c) {
  Locked([&] { contexts_.push_back(c); });
}
void Registry::RemoveContext(Context* c) {
  Locked([&] {
    contexts_.erase(std::remove(contexts_.begin(), contexts_.end(), c), contexts_.end());
  });
}
void Registry::AddQp(uint32_t qpn, Qp* qp) {
  Locked([&] { qps_[qpn] = qp; });
}
void Registry::RemoveQp(uint32_t qpn) {
  Locked([&] { qps_.erase(qpn); });
}

void Registry::OnPeerGone(uint32_t qpn, PeerGone why) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = qps_.find(qpn);
  if (it == qps_.end()) return;
  Qp* qp = it->second;
  const auto reason = static_cast<uint32_t>(why);
  std::atomic<uint32_t>& gone = qp->conn.peer_gone;
  uint32_t cur = gone.load(std::memory_order_relaxed);
  // A death outranks an orderly close, a refusal both.
  while (cur < reason && !gone.compare_exchange_weak(cur, reason, std::memory_order_release)) {
  }
  qp->ctx->attention.store(true, std::memory_order_release);
  // A process asleep on a completion channel must poll to see the error.
  WakeQpCqs(qp);
}

namespace {
void InstallRings(Qp* qp);  // below
}  // namespace

template <typename F>
void Registry::UnderContextLock(uint32_t qpn, F&& f) {
  // Registry, then context lock: no thread takes them the other way round.
  std::lock_guard<std::mutex> g(mu_);
  auto it = qps_.find(qpn);
  if (it == qps_.end()) return;
  Qp* qp = it->second;
  {
    UrgentGuard l(qp->ctx->lock);
    Guarded([&] {
      f(qp);
      return 0;
    });
  }
}

void Registry::OnPeerNamed(uint32_t qpn) {
  // Linked now, and what waited for the link sent, as an HCA would once the peer accepts:
  // the program may not call again. If the link cannot be had yet, the next verb (or tick)
  // asks again.
  UnderContextLock(qpn, [](Qp* qp) {
    if (qp->conn.awaited.waiting && TryAwaitedLink(qp) != 0) {
      qp->conn.peer_named.store(true, std::memory_order_release);
      qp->ctx->attention.store(true, std::memory_order_release);
    }
    if (qp->sq.in_pending_list) Progress(qp);
    WakeQpCqs(qp);  // a receiver asleep on its channel should link up now
  });
}

void Registry::OnUdRing(const ff::proto::Event& e, UniqueFd fd) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = qps_.find(e.qpn);
  if (it == qps_.end() || !it->second->kind->datagram) return;
  Qp* qp = it->second;
  bool again = false;
  {
    std::lock_guard<std::mutex> a(qp->inbound.arriving_mu);
    auto& arriving = qp->inbound.arriving;
    again = std::any_of(arriving.begin(), arriving.end(),
                        [&](const Inbound::ArrivingRing& r) { return r.ring == e.ring; });
    arriving.push_back(Inbound::ArrivingRing{e.ring, e.src_ip, e.src_qpn, std::move(fd)});
  }
  if (again) {
    // A second sender of a ring before the program polled (other processes take the QP's
    // rings faster than it polls): the rings are installed now, what the earlier senders
    // published delivered, so that what waits stays one ring (one descriptor) per ring of
    // the QP, however often its rings change hands meanwhile.
    UrgentGuard l(qp->ctx->lock);
    Guarded([&] {
      InstallRings(qp);
      return 0;
    });
    return;
  }
  qp->ctx->attention.store(true, std::memory_order_release);
  WakeQpCqs(qp);  // a receiver asleep on its channel must poll to take the ring in
}

void Registry::OnUdPeerLost(const ff::proto::Event& e) {
  UnderContextLock(e.qpn, [&](Qp* qp) {
    if (!qp->kind->datagram) return;
    std::erase_if(qp->conn.ud_links, [&](const auto& entry) {
      return entry.second->peer_ip == e.src_ip && entry.second->peer_qpn == e.src_qpn;
    });
    ResumeSends(qp);  // a datagram blocked on that link's ring asks for a new one
  });
}

void Registry::OnProxyDrained(uint32_t qpn) { UnderContextLock(qpn, ResumeSends); }

namespace {

// Advances the stalled sends of `ctx` unless its program is advancing them itself (it made a
// ProgressPending() pass since the last tick); then notes what still stalls. ctx->lock held.
void TickContext(Context* ctx, Registry::TickOutcome* out) {
  if (ctx->passes.load(std::memory_order_relaxed) == ctx->tick_passes) {
    if (ctx->attention.load(std::memory_order_relaxed)) HandleAttention(ctx);
    std::vector<std::pair<Qp*, uint64_t>> before;
    for (Qp* qp : ctx->pending)
      if (qp->sq.stalled) before.emplace_back(qp, qp->sq.exec);
    ProgressPending(ctx);
    for (const auto& [qp, exec] : before) out->advanced = out->advanced || qp->sq.exec != exec;
  }
  ctx->tick_passes = ctx->passes.load(std::memory_order_relaxed);
  bool stalled = false;
  for (const Qp* qp : ctx->pending) {
    if (!qp->sq.stalled) continue;
    stalled = true;
    out->due = std::min(out->due, qp->sq.stall_due_ns);
  }
  // Under the lock: a Progress() that stalls after this sees false and wakes us again.
  if (!stalled) ctx->stalled.store(false, std::memory_order_relaxed);
  out->stalled = out->stalled || stalled;
}

}  // namespace

Registry::TickOutcome Registry::Tick() {
  TickOutcome out;
  // Registry, then context lock, as every event does.
  std::lock_guard<std::mutex> g(mu_);
  for (Context* ctx : contexts_) {
    if (!ctx->stalled.load(std::memory_order_acquire)) continue;
    UrgentGuard l(ctx->lock);
    const int rc = Guarded([&] {
      TickContext(ctx, &out);
      return 0;
    });
    if (rc != 0) out.stalled = true;  // no memory to look: look again later
  }
  return out;
}

void Registry::OnFatal() {
  std::lock_guard<std::mutex> g(mu_);
  for (auto& [qpn, qp] : qps_)
    qp->conn.peer_gone.store(static_cast<uint32_t>(PeerGone::kDied), std::memory_order_release);
  for (Context* c : contexts_) {
    c->attention.store(true, std::memory_order_release);
    PushAsyncEvent(c, IBV_EVENT_DEVICE_FATAL, nullptr);
  }
  for (auto& [qpn, qp] : qps_) WakeQpCqs(qp);
}

namespace {

// Takes in the UD rings the router announced: what the last sender of a ring published is
// delivered first, then the ring is the new sender's. A new sender may publish (and fire our
// receive CQ) before we hear of its ring: the application then took that event and polled
// nothing. Messages found waiting in a ring we install now fire the CQ again if it is armed,
// or they would wait for the next message. ctx->lock held.
void InstallRings(Qp* qp) {
  Inbound& in = qp->inbound;
  std::vector<Inbound::ArrivingRing> rings;
  {
    std::lock_guard<std::mutex> a(in.arriving_mu);
    rings.swap(in.arriving);
  }
  bool waiting = false;
  for (Inbound::ArrivingRing& r : rings) {
    Mapping map;
    if (r.ring >= in.num_rings ||
        ff::MapPeerSegment(r.fd.get(), ff::UdRingBytes(in.ring_bytes), true, &map) != 0) {
      LogError("QP 0x%x: the router announced a ring that cannot be used", qp->qpx.qp_base.qp_num);
      continue;
    }
    ff::RingConsumer& cons = in.consumers[r.ring];
    if (cons.attached()) Drain(qp);
    cons = ff::RingConsumer{};
    cons.Attach(map.as<ff::RingHeader>(), in.ring_bytes);
    in.messages[r.ring] = InboundState{};
    in.sources[r.ring] = Inbound::UdSource{r.ip, r.qpn, std::move(map)};
    ff::RecordHeader h;
    const char* payload = nullptr;
    waiting = waiting || cons.Peek(&h, &payload) == ff::RingStatus::kOk;
  }
  if (waiting && qp->rcq != nullptr) FireIfArmed(qp->rcq);
}

}  // namespace

void HandleAttention(Context* ctx) {
  if (!ctx->attention.exchange(false, std::memory_order_acq_rel)) return;
  const bool router_gone = ctx->session->fatal.load();
  for (Qp* qp : ctx->qps) {
    if (qp->kind->datagram) InstallRings(qp);
    if (qp->conn.peer_named.exchange(false, std::memory_order_acq_rel) && qp->conn.awaited.waiting)
      TryAwaitedLink(qp);  // on failure the first WQE asks again (AwaitPeer)
    const uint32_t gone = qp->conn.peer_gone.load(std::memory_order_acquire);
    if (gone == 0) continue;
    const ibv_qp_state state = qp->qpx.qp_base.state;
    // The router has no such QP: fail it in whatever state (it has no link yet, or one that
    // only its own router could have made and did not).
    if (gone == static_cast<uint32_t>(PeerGone::kRefused)) {
      if (state != IBV_QPS_ERR) FailPeerless(ctx, qp);
      continue;
    }
    if (state == IBV_QPS_RESET || state == IBV_QPS_ERR) continue;
    // Deliver what the peer published before it went, and the outcomes that came back
    // before the news, then fail the connection.
    Drain(qp);
    if (PeerLink* link = qp->conn.link.get()) {
      link->ops->peer_gone(qp, link);
      if (!Retire(qp)) continue;  // an outcome already moved the QP to ERR
      link->dead = true;
    }
    // An orderly close, as on a fabric: posted receives stay, sends from now on fail
    // (requests already in flight are still answered).
    if (gone == static_cast<uint32_t>(PeerGone::kDestroyed) && !router_gone) continue;
    if (qp->kind->datagram && !router_gone) continue;  // no peer of its own to lose
    FailPeerless(ctx, qp);
  }
}

}  // namespace ff::verbs
