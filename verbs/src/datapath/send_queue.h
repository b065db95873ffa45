// The send queue of a QP: ibv_post_send and the two-phase queue behind it.
//
// WQEs are *executed* in posting order through their link's operations (LinkOps::execute;
// on one node that finishes them at once, through the router it leaves them in flight) and
// *retired* in posting order once their outcome is known, so completions keep their order
// and an error completes exactly the WQE that caused it; the QP then goes to ERR and the
// rest is flushed. A QP with WQEs not yet retired is on its context's `pending` list, and
// every poll_cq (and ibv_get_cq_event) advances those. All functions: ctx->lock held.
#pragma once

#include "base/objects.h"

namespace ff::verbs {

// ctx->ops entry point.
int PostSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad);
// PostSend() for ibv_bind_mw: the one way a type 1 window's bind joins the send queue.
int PostBindType1(ibv_qp* qp, ibv_send_wr* wr);

// What a memory-window WQE (BIND_MW, LOCAL_INV) does when it is executed, in order with the
// rest of the queue (mw.cc): its completion status.
ibv_wc_status ExecuteWindowOp(Qp* qp, const SendWqe& w);
// Unbinds type 2 window `key` of `ctx` (LOCAL_INV; with `qpn` != 0 a SEND_WITH_INV received
// on that QP, which must be the one the window is bound through): 0 or an errno value.
int InvalidateMw(Context* ctx, uint32_t key, uint32_t qpn);

// Executes what can be executed and retires what is done.
void Progress(Qp* qp);
// Progress() for every QP on ctx->pending.
void ProgressPending(Context* ctx);
// The event thread's Progress(), when the router made room that WQEs of `qp` waited for
// (kProxyDrained): takes the router's nudge, so that the next WQE to block asks again.
void ResumeSends(Qp* qp);
// A WQE of `qp` just failed with IBV_WC_RETRY_EXC_ERR because its peer is gone: its
// completion, and the QP's move to ERR, wait until the QP's retries would have run out
// (RetryExhaustedAt), as on a fabric, where the peer's last answers still come in meanwhile.
void HoldPeerError(Qp* qp);
// Completes finished WQEs in posting order. false when an error moved the QP to ERR (the
// rest was flushed).
bool Retire(Qp* qp);
// Completes every WQE not yet completed: the first with `first_status`, the rest flushed;
// flushes the receive queue too. The QP's state is the caller's business.
void FailQp(Qp* qp, ibv_wc_status first_status);
// Moves `qp` to the error state and FailQp()s it (a transport error, a broken ring, a
// peer that went away, or modify_qp to ERR). A QP that was receiving (RTR..SQE) first
// completes what its rings hold (DeliverArrived); one already in ERR does not, which is how
// the receive path, failing a QP itself, keeps what follows the failing message out.
void MoveToError(Qp* qp, ibv_wc_status first_status);
// Installs the ibv_wr_* functions of `qp`, which batch WQEs for PostSend (wr_api.cc).
void InitQpEx(Qp* qp);

// Forgets every queued WQE and inbound record without completions (modify_qp to RESET).
void ResetQueues(Qp* qp);

}  // namespace ff::verbs
