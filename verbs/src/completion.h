// Completion queues: the CQ ring the data path fills, poll_cq (which also drives sends and
// drains receive rings), completion events and the wake-ups behind them.
//
// Event words: a CQ with a completion channel owns a NotifySlot in its session's notify
// segment. req_notify_cq arms it; whoever adds a completion (this process, or a peer or
// router publishing a record that becomes one) disarms it and sends on the channel's wake socket.
#pragma once

#include "internal.h"
#include "session.h"

namespace ffv {

inline bool CqFull(const Cq* cq) { return cq->tail - cq->head > cq->mask; }

inline ff::NotifySlot* EventSlot(const Cq* cq) { return cq->ctx->session->slot(cq->notify_slot); }

void OnCqOverflow(Cq* cq);  // rare: reported once per CQ

// Fires `cq`'s completion event whether or not it is armed, so that a process asleep in
// ibv_get_cq_event polls and sees an error. Any thread.
void WakeCq(Cq* cq);

// Adds a completion (ctx->lock held) and fires the event if req_notify_cq armed it. No fence
// is needed against the arming side: after arming, it polls under the lock we hold.
inline void PushWc(Cq* cq, const ibv_wc& wc) {
  if (__builtin_expect(CqFull(cq), 0)) {
    OnCqOverflow(cq);
    return;
  }
  cq->wcs[cq->tail & cq->mask] = wc;
  ++cq->tail;
  if (cq->notify_slot == ff::proto::kNoId) return;
  ff::NotifySlot* slot = EventSlot(cq);
  if (slot->armed.load(std::memory_order_relaxed) && slot->armed.exchange(0)) WakeCq(cq);
}

// ctx->ops entry points.
int PollCq(ibv_cq* cq, int n, ibv_wc* wc);
int ReqNotifyCq(ibv_cq* cq, int solicited_only);

}  // namespace ffv
