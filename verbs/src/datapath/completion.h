// Completion queues: the CQ ring the data path fills, poll_cq (which also drives sends and
// drains receive rings), completion events and the wake-ups behind them.
//
// Event words: a CQ with a completion channel owns a NotifySlot in its session's notify
// segment. req_notify_cq arms it; whoever adds a completion (this process, or a peer or
// router publishing a record that becomes one) disarms it and sends on the channel's wake socket.
#pragma once

#include "base/objects.h"
#include "session/session.h"

namespace ff::verbs {

inline bool CqFull(const Cq* cq) { return cq->tail - cq->head > cq->mask; }

inline ff::NotifySlot* EventSlot(const Cq* cq) { return cq->ctx->session->slot(cq->notify_slot); }

void OnCqOverflow(Cq* cq);  // rare: reported once per CQ

// Fires `cq`'s completion event (its caller disarmed it). Any thread.
void FireCq(Cq* cq);
// Fires it if it is armed (for any completion or solicited ones): completions are waiting
// whose publisher's event the application may have taken before it could see them.
void FireIfArmed(Cq* cq);

// Wakes a process asleep in ibv_get_cq_event on `cq`'s channel without an event: it handles
// what the router told it (a peer linked up or went away, a UD ring arrived), which may add
// completions that fire events of their own, and sleeps again if none did. A real channel
// never delivers an event without a completion, and programs that take one event per
// completion (perftest's and qperf's event loops) go out of step on a spurious one. Any
// thread.
void NudgeCq(Cq* cq);

// Adds a completion (ctx->lock held) and fires the event if req_notify_cq armed it. No fence
// is needed against the arming side: after arming, it polls under the lock we hold.
// `announced`: the completion comes from a record or response whose publisher already fired
// the event when it published it (a peer, or the router). It entered the CQ then, as far as
// the application can tell, so taking it out of a ring now must not fire the event again:
// a program that re-arms, then polls (the usual loop) would get a second event for it.
// Publishers fire a CQ armed for solicited completions only for solicited messages, so an
// unsuccessful completion still fires it here.
inline void PushWc(Cq* cq, const ibv_wc& wc, bool announced = false) {
  if (__builtin_expect(CqFull(cq), 0)) {
    OnCqOverflow(cq);
    return;
  }
  cq->wcs[cq->tail & cq->mask] = wc;
  ++cq->tail;
  if (cq->notify_slot == ff::proto::kNoId) return;
  // Completions made here are never solicited messages: a CQ armed for those alone fires
  // only on an error.
  if (ff::TakeArm(EventSlot(cq), !announced, wc.status != IBV_WC_SUCCESS)) FireCq(cq);
}

// poll_cq with cq->ctx->lock held: up to `n` completions into `wc`, or -errno. An empty
// poll of a router-fed CQ sleeps briefly on the router's wake word if `may_sleep` (the lock
// is released meanwhile).
int PollLocked(Cq* cq, int n, ibv_wc* wc, bool may_sleep);

// Extended CQs (cq_ex.cc). The work-completion fields an extended CQ can report, and the
// poll and read functions of one created with `wc_flags` (a subset of them).
inline constexpr uint64_t kCqExWcFlags =
    IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM | IBV_WC_EX_WITH_QP_NUM | IBV_WC_EX_WITH_SRC_QP |
    IBV_WC_EX_WITH_SLID | IBV_WC_EX_WITH_SL | IBV_WC_EX_WITH_DLID_PATH_BITS;
void InstallCqExOps(Cq* cq, uint64_t wc_flags);
// vctx->create_cq_ex (objects.cc).
ibv_cq_ex* CreateCqEx(ibv_context* context, ibv_cq_init_attr_ex* attr);
// vctx->open_xrcd, close_xrcd, create_srq_ex (objects.cc): no XRC.
ibv_xrcd* OpenXrcd(ibv_context* context, ibv_xrcd_init_attr* attr);
int CloseXrcd(ibv_xrcd* xrcd);
ibv_srq* CreateSrqEx(ibv_context* context, ibv_srq_init_attr_ex* attr);

// ctx->ops entry points.
int PollCq(ibv_cq* cq, int n, ibv_wc* wc);
int ReqNotifyCq(ibv_cq* cq, int solicited_only);

}  // namespace ff::verbs
