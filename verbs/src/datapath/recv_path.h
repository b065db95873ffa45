// The receive side of a QP: ibv_post_recv / ibv_post_srq_recv, and turning records that
// peers (or the router) published into the QP's inbound rings into receive completions.
// Records are taken only when the owner polls (poll_cq), so receive buffers are written
// by the owning process alone. All functions but the entry points: ctx->lock held.
#pragma once

#include "base/objects.h"

namespace ff::verbs {

// ctx->ops entry points.
int PostRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad);
int PostSrqRecv(ibv_srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad);

// Sizes a receive queue for `max_wr` WQEs of `max_sge` SGEs whose credits live at `credits`.
void InitRecvQueue(RecvQueue* rq, uint32_t max_wr, uint32_t max_sge, ff::RecvCredits* credits);
// Turns published records of `qp`'s rings into receive completions. false when a ring
// turned out corrupt or a message did not fit (the QP was failed).
bool Drain(Qp* qp);
// An empty poll's spare moment: starts bringing the first line of the buffer of the next
// receive of the queue a message last landed in (ctx->warm_rq) into the cache. A program
// cycles through many receive buffers (UCX's rc_verbs posts thousands), and on a VM the
// first touch of a buffer not used for a while costs the copy of the next message about
// half a microsecond; taken while the program waits, it is off that message's path.
void WarmNextRecv(Context* ctx);
// For a QP leaving RTR/RTS: what peers published into its rings was received, as a NIC
// has completed it by then (its sender saw it arrive), so it completes now (as far as the
// CQ has room), before the remaining receives are flushed; a message cut off part way
// completes with IBV_WC_WR_FLUSH_ERR.
void DeliverArrived(Qp* qp);
// Completes every posted receive of `qp` (not its SRQ's) with IBV_WC_WR_FLUSH_ERR and
// withdraws the credits senders could still claim.
void FlushRecvs(Qp* qp);
// Forgets posted receives and inbound records without completions (modify_qp to RESET).
void ResetRecv(Qp* qp);
// Shows `srq`'s unclaimed receives to the senders of each of its QPs: their header's
// `posted` becomes the messages we took from them plus what the SRQ has unclaimed (shm_layout.h,
// SrqSegment). A hint for their flow control (an RC sender waits for credit; datagrams
// claim nothing); the receiver claims each message on the SRQ.
void MirrorSrqCredits(Srq* srq);
void MirrorSrqCredits(Qp* qp);

}  // namespace ff::verbs
