#include "registry.h"

#include <algorithm>

namespace ffv {

Registry& Registry::Get() {
  static Registry* r = new Registry();  // never destroyed: the event thread may outlive main
  return *r;
}

void Registry::AddContext(Context* c) {
  std::lock_guard<std::mutex> g(mu_);
  contexts_.push_back(c);
}

void Registry::RemoveContext(Context* c) {
  std::lock_guard<std::mutex> g(mu_);
  contexts_.erase(std::remove(contexts_.begin(), contexts_.end(), c), contexts_.end());
}

void Registry::AddQp(uint32_t qpn, Qp* qp) {
  std::lock_guard<std::mutex> g(mu_);
  qps_[qpn] = qp;
}

void Registry::RemoveQp(uint32_t qpn) {
  std::lock_guard<std::mutex> g(mu_);
  qps_.erase(qpn);
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
  // Wake a process that sleeps on a completion channel so it polls and sees the error.
  if (qp->scq != nullptr) WakeCq(qp->scq);
  if (qp->rcq != nullptr && qp->rcq != qp->scq) WakeCq(qp->rcq);
}

void Registry::OnFatal() {
  std::lock_guard<std::mutex> g(mu_);
  for (auto& [qpn, qp] : qps_) {
    qp->peer_gone.store(static_cast<uint32_t>(PeerGone::kDied), std::memory_order_release);
  }
  for (Context* c : contexts_) {
    c->attention.store(true, std::memory_order_release);
    PushAsyncEvent(c, IBV_EVENT_DEVICE_FATAL, nullptr);
  }
  for (auto& [qpn, qp] : qps_) {
    if (qp->scq != nullptr) WakeCq(qp->scq);
    if (qp->rcq != nullptr) WakeCq(qp->rcq);
  }
}

}  // namespace ffv
