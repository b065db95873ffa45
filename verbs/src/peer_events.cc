#include "peer_events.h"

#include <algorithm>

#include "completion.h"
#include "link.h"
#include "recv_path.h"
#include "send_queue.h"
#include "session.h"

namespace ffv {
namespace {

void WakeQpCqs(Qp* qp) {
  if (qp->scq != nullptr) WakeCq(qp->scq);
  if (qp->rcq != nullptr && qp->rcq != qp->scq) WakeCq(qp->rcq);
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

void Registry::OnPeerGone(uint32_t qpn, bool died) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = qps_.find(qpn);
  if (it == qps_.end()) return;
  Qp* qp = it->second;
  const auto reason = static_cast<uint32_t>(died ? PeerGone::kDied : PeerGone::kDestroyed);
  uint32_t cur = qp->peer_gone.load(std::memory_order_relaxed);
  // A death outranks an orderly close.
  while (cur < reason &&
         !qp->peer_gone.compare_exchange_weak(cur, reason, std::memory_order_release)) {
  }
  qp->ctx->attention.store(true, std::memory_order_release);
  // A process asleep on a completion channel must poll to see the error.
  WakeQpCqs(qp);
}

void Registry::OnFatal() {
  std::lock_guard<std::mutex> g(mu_);
  for (auto& [qpn, qp] : qps_)
    qp->peer_gone.store(static_cast<uint32_t>(PeerGone::kDied), std::memory_order_release);
  for (Context* c : contexts_) {
    c->attention.store(true, std::memory_order_release);
    PushAsyncEvent(c, IBV_EVENT_DEVICE_FATAL, nullptr);
  }
  for (auto& [qpn, qp] : qps_) WakeQpCqs(qp);
}

void HandleAttention(Context* ctx) {
  if (!ctx->attention.exchange(false, std::memory_order_acq_rel)) return;
  const bool router_gone = ctx->session->fatal.load();
  for (Qp* qp : ctx->qps) {
    const uint32_t gone = qp->peer_gone.load(std::memory_order_acquire);
    if (gone == 0) continue;
    const ibv_qp_state state = qp->qpx.qp_base.state;
    if (state == IBV_QPS_RESET || state == IBV_QPS_ERR) continue;
    // Deliver what the peer published before it went, and the outcomes that came back
    // before the news, then fail the connection.
    Drain(qp);
    if (PeerLink* link = qp->link.get()) {
      link->ops->peer_gone(qp, link);
      if (!Retire(qp)) continue;  // an outcome already moved the QP to ERR
      link->dead = true;
    }
    // An orderly close, as on a fabric: posted receives stay, sends from now on fail
    // (requests already in flight are still answered).
    if (gone == static_cast<uint32_t>(PeerGone::kDestroyed) && !router_gone) continue;
    if (qp->type == IBV_QPT_UD && !router_gone) continue;
    FailPeerless(ctx, qp);
  }
}

}  // namespace ffv
