// What happens when a peer or the router goes away. The router tells the event thread (a
// PeerGone or PeerClosed event naming one of our QPs, or the end of the connection); the
// event thread finds the QP in its session's registry, raises flags and wakes sleepers. The
// data path acts on the flags the next time a verb takes the context lock (HandleAttention).
#pragma once

#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "base/objects.h"

namespace ff::verbs {

// The live contexts and QPs of one session, by QP number (QP numbers are unique per router,
// so one registry per session). Its own mutex, never the contexts' locks: the event thread
// uses it while verbs run. Destroying a QP or closing a context removes it first.
class Registry {
 public:
  void AddContext(Context* c);
  void RemoveContext(Context* c);
  void AddQp(uint32_t qpn, Qp* qp);
  void RemoveQp(uint32_t qpn);
  // Event thread: the peer of `qpn` died or destroyed its QP, or the router refused the QP
  // (`reason`; a later reason outranks an earlier one).
  void OnPeerGone(uint32_t qpn, PeerGone reason);
  // Event thread: the router is gone; fail every QP and raise IBV_EVENT_DEVICE_FATAL.
  void OnFatal();
  // Event thread: the peer RC/UC QP `qpn` awaits has named it (kPeerNamed).
  void OnPeerNamed(uint32_t qpn);
  // Event thread: UD QP `e.qpn` has a new sender producing into ring memfd `fd` (kUdRing).
  void OnUdRing(const ff::proto::Event& e, UniqueFd fd);
  // Event thread: UD QP `e.qpn` lost its link to QP e.src_qpn at e.src_ip (kUdPeerLost):
  // the link is dropped, and what waited on it goes on, over a new link if one can be had.
  void OnUdPeerLost(const ff::proto::Event& e);
  // Event thread: the router made room that WQEs of `qpn` wait for (kProxyDrained). They
  // are advanced here, under the context lock, as an HCA advances its send queue without
  // the program: it may be waiting on memory the peer writes once they arrive.
  void OnProxyDrained(uint32_t qpn);

  // Runs f(qp) for QP `qpn`, if it is still registered, under its context's lock. true
  // when it ran.
  template <typename F>
  bool WithQp(uint32_t qpn, F&& f) {
    // Registry, then context lock: no thread takes them the other way round.
    std::lock_guard<std::mutex> g(mu_);
    auto it = qps_.find(qpn);
    if (it == qps_.end()) return false;
    UrgentGuard l(it->second->ctx->lock);
    f(it->second);
    return true;
  }

  // What one Tick() found.
  struct TickOutcome {
    bool stalled = false;       // some context still has stalled sends: tick again
    bool advanced = false;      // this tick executed WQEs that waited
    uint64_t due = UINT64_MAX;  // the earliest SendQueue::stall_due_ns of what still stalls
  };
  // Event thread: advances the stalled sends (SendQueue::stalled) of every context whose
  // program made no ProgressPending() pass since the last tick, as an HCA advances its send
  // queue without the program; clears Context::stalled where nothing stalls any more.
  TickOutcome Tick();

 private:
  // Runs f(qp) for QP `qpn`, if it is still registered, under its context's lock.
  template <typename F>
  void UnderContextLock(uint32_t qpn, F&& f);
  template <typename F>
  void Locked(F&& f) {
    std::lock_guard<std::mutex> g(mu_);
    f();
  }

  std::mutex mu_;
  std::vector<Context*> contexts_;
  std::unordered_map<uint32_t, Qp*> qps_;
};

// Applies the flags the event thread raised: QPs whose peer died (or whose router is gone)
// take in what already arrived, then go to ERR with IBV_WC_RETRY_EXC_ERR and QP_FATAL; QPs
// whose peer closed keep their receives and fail later sends. ctx->lock held.
void HandleAttention(Context* ctx);

}  // namespace ff::verbs
