// Receives (see recv_path.h).
#include "datapath/recv_path.h"

#include <arpa/inet.h>

#include <cstring>
#include <mutex>

#include "base/exports.h"
#include "datapath/completion.h"
#include "datapath/send_queue.h"
#include "datapath/sge.h"
#include "freeflow/ipv4.h"
#include "freeflow/target_ops.h"

namespace ff::verbs {
namespace {

RecvQueue* RqOf(Qp* qp) { return qp->srq != nullptr ? &qp->srq->rq : &qp->inbound.rq; }

// Lets senders claim no more receives than are posted now.
void WithdrawCredits(RecvQueue* rq) {
  rq->posted = rq->credits->claimed.load(std::memory_order_acquire);
  rq->credits->posted.store(rq->posted, std::memory_order_release);
}

bool PopRecv(Qp* qp, InboundState* in) {
  RecvQueue* rq = RqOf(qp);
  if (rq->head == rq->tail) return false;
  const uint32_t idx = static_cast<uint32_t>(rq->head & rq->mask);
  in->wqe = rq->wqes[idx];
  std::memcpy(in->sges, &rq->sges[static_cast<size_t>(idx) * rq->max_sge],
              sizeof(ibv_sge) * in->wqe.num_sge);
  ++rq->head;
  qp->ctx->warm_rq = rq;
  if (qp->srq != nullptr && qp->srq->limit != 0 && rq->count() < qp->srq->limit) {
    qp->srq->limit = 0;  // the limit event is one-shot until re-armed by modify_srq
    PushAsyncEvent(qp->ctx, IBV_EVENT_SRQ_LIMIT_REACHED, &qp->srq->srq);
  }
  return true;
}

void CompleteRecv(Qp* qp, const InboundState& in, const ff::RecordHeader& h, ibv_wc_opcode op,
                  uint32_t byte_len) {
  ibv_wc wc{};
  wc.wr_id = in.wqe.wr_id;
  wc.status = in.status;
  wc.opcode = op;
  wc.byte_len = byte_len;
  wc.qp_num = qp->qpx.qp_base.qp_num;
  wc.src_qp = h.src_qpn;
  wc.slid = ff::LidForIp(ntohl(h.src_ip), qp->ctx->session->overlay);
  if (h.flags & ff::kRecImm) {
    wc.wc_flags |= IBV_WC_WITH_IMM;
    wc.imm_data = h.imm;
  } else if ((h.flags & ff::kRecInv) && wc.status == IBV_WC_SUCCESS) {
    // The sender invalidates a type 2 window of ours bound through this QP (mw.cc).
    if (InvalidateMw(qp->ctx, h.imm, qp->qpx.qp_base.qp_num) == 0) {
      wc.wc_flags |= IBV_WC_WITH_INV;
      wc.invalidated_rkey = h.imm;
    } else {
      LogDebug("QP 0x%x: a SEND_WITH_INV names key 0x%x, no window bound through this QP",
               qp->qpx.qp_base.qp_num, h.imm);
      wc.status = IBV_WC_REM_INV_REQ_ERR;
    }
  }
  if (qp->kind->datagram) wc.wc_flags |= IBV_WC_GRH;
  PushWc(qp->rcq, wc, /*announced=*/true);
}

void WriteGrh(InboundState* in, const ff::RecordHeader& h, uint32_t my_ip) {
  ibv_grh grh{};
  grh.version_tclass_flow = htonl(6u << 28);
  grh.paylen = htons(static_cast<uint16_t>(h.msg_len));
  grh.next_hdr = 0x1b;
  grh.hop_limit = 64;
  ff::Ipv4MappedGid(ntohl(h.src_ip), grh.sgid.raw);
  ff::Ipv4MappedGid(my_ip, grh.dgid.raw);
  CopyToSges(in->sges, in->wqe.num_sge, 0, reinterpret_cast<const char*>(&grh), sizeof(grh));
}

// Cheaper than assigning a fresh InboundState: the SGE copy is left as it is.
inline void ResetInbound(InboundState* in) {
  in->active = false;
  in->drop = false;
  in->offset = 0;
  in->msg_len = 0;
  in->status = IBV_WC_SUCCESS;
}

// A message for a QP on an SRQ is claimed on the SRQ here, by its receiver, when it takes
// it: its sender claimed on the QP's header only (shm_layout.h, SrqSegment), so no sender
// can spend or promise away a receive another QP's message needs. false: none left.
bool ClaimOnSrq(Qp* qp) {
  if (qp->srq == nullptr) return true;  // the sender claimed on our own credits
  uint64_t posted = qp->srq->rq.posted;
  return ff::ClaimCredit(qp->srq->rq.credits, &posted);
}

// An RC message that needs a receive of an SRQ: claimed before its record is taken (one
// that finds none waits in its ring, DrainRing). UC and UD messages are claimed when they
// start, and dropped when none is left, as a fabric drops them.
bool RcNeedsSrqReceive(const Qp* qp, const ff::RecordHeader& h) {
  return qp->srq != nullptr && qp->qpx.qp_base.qp_type == IBV_QPT_RC &&
         ((h.kind == ff::kRecSend && (h.flags & ff::kRecFirst)) || h.kind == ff::kRecWriteImm);
}
bool ClaimsWhenStarted(const Qp* qp) {
  return qp->srq != nullptr && qp->qpx.qp_base.qp_type != IBV_QPT_RC;
}

// The first fragment of a message: takes a receive WQE for it, or drops it (no receive
// posted on UC/UD, or a wrong Q_Key).
void StartMessage(Qp* qp, InboundState* in, const ff::RecordHeader& h) {
  ResetInbound(in);
  if (qp->srq != nullptr) ++qp->inbound.srq_messages;
  const bool ud = qp->kind->datagram;
  if ((ud && h.qkey != qp->attr.qkey) || (ClaimsWhenStarted(qp) && !ClaimOnSrq(qp)) ||
      !PopRecv(qp, in)) {
    in->drop = true;
    return;
  }
  in->active = true;
  in->msg_len = h.msg_len;
  in->offset = ud ? sizeof(ibv_grh) : 0;
  if (in->offset + h.msg_len > in->wqe.total) {
    in->status = IBV_WC_LOC_LEN_ERR;
  } else if (ud) {
    WriteGrh(in, h, qp->ctx->session->ip);
  }
}

// One fragment of a SEND. false when the message failed the QP (a length error on RC/UC).
bool TakeSendRecord(Qp* qp, InboundState* in, const ff::RecordHeader& h, const char* payload) {
  if (h.flags & ff::kRecFirst) StartMessage(qp, in, h);
  if (in->active && in->status == IBV_WC_SUCCESS) {
    if (in->offset + h.frag_len > in->wqe.total) {
      in->status = IBV_WC_LOC_LEN_ERR;
    } else {
      CopyToSges(in->sges, in->wqe.num_sge, in->offset, payload, h.frag_len);
      in->offset += h.frag_len;
    }
  }
  if (!(h.flags & ff::kRecLast)) return true;
  bool ok = true;
  if (in->active) {
    const uint32_t len = in->msg_len + (qp->kind->datagram ? sizeof(ibv_grh) : 0);
    CompleteRecv(qp, *in, h, IBV_WC_RECV, len);
    ok = in->status == IBV_WC_SUCCESS || !qp->kind->error_fails_qp;
  }
  ResetInbound(in);
  return ok;
}

void TakeWriteImm(Qp* qp, const ff::RecordHeader& h) {
  InboundState& imm = qp->inbound.imm_scratch;
  ResetInbound(&imm);
  if (qp->srq != nullptr) ++qp->inbound.srq_messages;
  if ((!ClaimsWhenStarted(qp) || ClaimOnSrq(qp)) && PopRecv(qp, &imm))
    CompleteRecv(qp, imm, h, IBV_WC_RECV_RDMA_WITH_IMM, h.msg_len);
}

// Drains ring `r` (at most kDrainBudget records). false when the QP was failed.
bool DrainRing(Qp* qp, uint32_t r, bool discard) {
  ff::RingConsumer& cons = qp->inbound.consumers[r];
  if (!cons.attached()) return true;  // a UD ring nobody was given yet
  InboundState& in = qp->inbound.messages[r];
  const Inbound::UdSource* source = qp->kind->datagram ? &qp->inbound.sources[r] : nullptr;
  bool consumed = false;
  bool ok = true;
  for (int budget = 0; ok && budget < ff::kDrainBudget; ++budget) {
    if (!discard && CqFull(qp->rcq)) break;
    ff::RecordHeader h;
    const char* payload = nullptr;
    const ff::RingStatus rs = cons.Peek(&h, &payload);
    if (rs == ff::RingStatus::kEmpty) break;
    if (rs == ff::RingStatus::kCorrupt) {
      LogError("QP 0x%x: the peer corrupted its ring; moving the QP to the error state",
               qp->qpx.qp_base.qp_num);
      ok = false;
      break;
    }
    // An RC message with no receive left on its SRQ waits here, as at a sender that got an
    // RNR NAK: later records of this ring wait behind it, other QPs go on (PostSrqRecv
    // takes it once there is a receive).
    if (!discard && RcNeedsSrqReceive(qp, h) && !ClaimOnSrq(qp)) {
      qp->inbound.srq_waits = true;
      break;
    }
    consumed = true;
    cons.Consume(h);
    if (discard) continue;
    if (source != nullptr) {  // who sent it is the ring's, not the record's to say
      h.src_ip = htonl(source->ip);
      h.src_qpn = source->qpn;
    }
    if (h.kind == ff::kRecSend) {
      ok = TakeSendRecord(qp, &in, h, payload);
    } else if (h.kind == ff::kRecWriteImm) {
      TakeWriteImm(qp, h);
    }
  }
  if (consumed) cons.Release();
  if (!ok) {
    // The receive side failed the QP itself: nothing published after the failing record
    // was received (a NIC's responder in ERR takes no more), so nothing more is delivered.
    qp->qpx.qp_base.state = IBV_QPS_ERR;
    MoveToError(qp, IBV_WC_WR_FLUSH_ERR);
  }
  return ok;
}

int PostRecvCommon(Context* ctx, Qp* qp, const ibv_pd* pd, RecvQueue* rq, ibv_recv_wr* wr,
                   ibv_recv_wr** bad) {
  int rc = 0;
  uint64_t added = 0;
  for (; wr != nullptr; wr = wr->next) {
    if (rq->count() >= rq->max_wr) {
      rc = ENOMEM;
      break;
    }
    if (wr->num_sge < 0 || static_cast<uint32_t>(wr->num_sge) > rq->max_sge ||
        !ValidSges(ctx, pd, wr->sg_list, static_cast<uint32_t>(wr->num_sge),
                   IBV_ACCESS_LOCAL_WRITE)) {
      rc = EINVAL;
      break;
    }
    const uint32_t idx = static_cast<uint32_t>(rq->tail & rq->mask);
    RecvWqe& wqe = rq->wqes[idx];
    wqe.wr_id = wr->wr_id;
    wqe.num_sge = static_cast<uint32_t>(wr->num_sge);
    wqe.total = 0;
    for (int i = 0; i < wr->num_sge; ++i) {
      rq->sges[static_cast<size_t>(idx) * rq->max_sge + i] = wr->sg_list[i];
      wqe.total += wr->sg_list[i].length;
    }
    ++rq->tail;
    ++added;
  }
  if (rc != 0) *bad = wr;
  if (qp != nullptr && qp->qpx.qp_base.state == IBV_QPS_ERR) {
    FlushRecvs(qp);
    return rc;
  }
  if (added != 0) {
    rq->posted += added;
    rq->credits->posted.store(rq->posted, std::memory_order_release);
  }
  return rc;
}

}  // namespace

void InitRecvQueue(RecvQueue* rq, uint32_t max_wr, uint32_t max_sge, ff::RecvCredits* credits) {
  rq->max_wr = max_wr;
  rq->max_sge = max_sge == 0 ? 1 : max_sge;
  const uint32_t cap = RoundPow2(max_wr == 0 ? 1 : max_wr);
  rq->mask = cap - 1;
  rq->wqes.assign(cap, RecvWqe{});
  rq->sges.assign(static_cast<size_t>(cap) * rq->max_sge, ibv_sge{});
  rq->credits = credits;
  rq->posted = credits->posted.load(std::memory_order_relaxed);
}

void WarmNextRecv(Context* ctx) {
  const RecvQueue* rq = ctx->warm_rq;
  if (rq == nullptr) return;
  ctx->warm_rq = nullptr;
  if (rq->head == rq->tail) return;
  // A prefetch never faults: the SGE slot of a receive without SGEs (an old address, or
  // none) costs nothing.
  const size_t idx = static_cast<size_t>(rq->head & rq->mask);
  const uint64_t addr = rq->sges[idx * rq->max_sge].addr;
  __builtin_prefetch(reinterpret_cast<const void*>(static_cast<uintptr_t>(addr)), 1, 3);
}

bool Drain(Qp* qp) {
  const ibv_qp_state state = qp->qpx.qp_base.state;
  if (state == IBV_QPS_RESET || state == IBV_QPS_INIT) return true;  // not receiving yet
  const bool discard = state == IBV_QPS_ERR;
  for (uint32_t r = 0; r < qp->inbound.num_rings; ++r) {
    if (!DrainRing(qp, r, discard)) return false;
  }
  return true;
}

void DeliverArrived(Qp* qp) {
  // kDrainBudget records a pass; a ring holds at most one record per cache line.
  const uint32_t passes = qp->inbound.ring_bytes / ff::kCacheLine / ff::kDrainBudget + 1;
  for (uint32_t r = 0; r < qp->inbound.num_rings; ++r) {
    for (uint32_t i = 0; i < passes; ++i) {
      if (!DrainRing(qp, r, /*discard=*/false)) return;  // failed: flushed already
    }
  }
  // A message cut off part way: its receive is flushed.
  for (uint32_t r = 0; r < qp->inbound.num_rings; ++r) {
    InboundState& in = qp->inbound.messages[r];
    if (!in.active) continue;
    ibv_wc wc{};
    wc.wr_id = in.wqe.wr_id;
    wc.status = IBV_WC_WR_FLUSH_ERR;
    wc.opcode = IBV_WC_RECV;
    wc.qp_num = qp->qpx.qp_base.qp_num;
    PushWc(qp->rcq, wc);
    ResetInbound(&in);
  }
}

void FlushRecvs(Qp* qp) {
  if (qp->srq != nullptr) return;  // SRQ receives belong to the SRQ, not the QP
  RecvQueue* rq = &qp->inbound.rq;
  while (rq->head != rq->tail) {
    ibv_wc wc{};
    wc.wr_id = rq->wqes[rq->head & rq->mask].wr_id;
    wc.status = IBV_WC_WR_FLUSH_ERR;
    wc.opcode = IBV_WC_RECV;
    wc.qp_num = qp->qpx.qp_base.qp_num;
    PushWc(qp->rcq, wc);
    ++rq->head;
  }
  WithdrawCredits(rq);
}

void ResetRecv(Qp* qp) {
  Inbound& in = qp->inbound;
  if (qp->srq == nullptr) {
    in.rq.head = in.rq.tail;
    WithdrawCredits(&in.rq);
  }
  for (uint32_t r = 0; r < in.num_rings; ++r) {
    in.messages[r] = InboundState{};
    ff::RingConsumer& cons = in.consumers[r];
    if (!cons.attached()) continue;
    ff::RecordHeader h;
    const char* payload;
    // A ring holds at most one record per cache line.
    for (uint32_t i = 0; i < in.ring_bytes / ff::kCacheLine; ++i) {
      if (cons.Peek(&h, &payload) != ff::RingStatus::kOk) break;
      cons.Consume(h);
    }
    cons.Release();
  }
}

int PostRecv(ibv_qp* ibqp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  Qp* qp = ToQp(ibqp);
  Context* ctx = qp->ctx;
  std::lock_guard<AdaptiveLock> l(ctx->lock);
  if (qp->srq != nullptr || ibqp->state == IBV_QPS_RESET) {
    *bad = wr;
    return EINVAL;
  }
  return Guarded(
      [&] { return PostRecvCommon(ctx, qp, qp->qpx.qp_base.pd, &qp->inbound.rq, wr, bad); });
}

int PostSrqRecv(ibv_srq* ibsrq, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  Srq* srq = ToSrq(ibsrq);
  std::lock_guard<AdaptiveLock> l(srq->ctx->lock);
  return Guarded([&] {
    const int rc = PostRecvCommon(srq->ctx, nullptr, srq->srq.pd, &srq->rq, wr, bad);
    // What waited for a receive takes it first; then the senders see what is left.
    for (Qp* qp : srq->qps) {
      if (!qp->inbound.srq_waits) continue;
      qp->inbound.srq_waits = false;
      Drain(qp);
    }
    MirrorSrqCredits(srq);
    return rc;
  });
}

void MirrorSrqCredits(Qp* qp) {
  const ff::RecvCredits* srq = qp->srq->rq.credits;
  const uint64_t claimed = srq->claimed.load(std::memory_order_acquire);
  const uint64_t posted = qp->srq->rq.posted;
  const uint64_t unclaimed = posted > claimed ? posted - claimed : 0;
  // Our header, mapped by this QP's senders only: they may claim what the SRQ has unclaimed
  // beyond the messages of theirs we took (received, or dropped on UD and UC), less those
  // still on their way to us. Written from our own counts only: what they write there
  // changes only what they see, and reading their claimed count at every post would move
  // its cache line between cores for every message.
  auto* hdr = qp->inbound.seg.as<ff::QpSegmentHeader>();
  hdr->credits.posted.store(qp->inbound.srq_messages + unclaimed, std::memory_order_release);
}

void MirrorSrqCredits(Srq* srq) {
  for (Qp* qp : srq->qps) MirrorSrqCredits(qp);
}

}  // namespace ff::verbs
