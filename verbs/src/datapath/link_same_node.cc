// Links to a peer process on this node (kSameNodeOps). The router is not involved: a SEND
// claims a receive credit of the peer's receive queue and copies the payload into the peer
// QP's inbound ring; RDMA WRITE, READ and ATOMIC check the peer's MR table and then copy
// straight into or out of its registered memory (mapped through the router on first use).
// The peer process does nothing. No system call unless a peer's completion channel must be
// woken (after publishing, send_queue.cc).
#include "datapath/link.h"
#include "datapath/sge.h"
#include "freeflow/target_ops.h"

namespace ff::verbs {
namespace {

bool NeedsCredit(uint32_t opcode) {
  return opcode == IBV_WR_SEND || opcode == IBV_WR_SEND_WITH_IMM ||
         opcode == IBV_WR_SEND_WITH_INV || opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
}

// The peer has no receive posted. RC retries (kBlocked) until rnr_retry x the peer's
// min_rnr_timer is spent; UC and UD drop the message, as a fabric does.
Exec NoCredit(Qp* qp, PeerLink* link, SendWqe& w, ibv_wc_status* st) {
  if (!qp->kind->rnr_retry) return Exec::kDone;
  if (!ff::RnrRetryExhausted(&w.rnr, link->hdr->min_rnr_timer.load(std::memory_order_relaxed),
                             qp->attr.rnr_retry, ff::MonotonicNs()))
    return Exec::kBlocked;
  *st = IBV_WC_RNR_RETRY_EXC_ERR;
  return Exec::kDone;
}

// Checks an access to the peer's memory and finds where it is mapped here (the same check
// the router's executor makes for initiators on other nodes).
ibv_wc_status ResolveTarget(Qp* qp, PeerLink* link, const SendWqe& w, uint64_t len, uint32_t need,
                            char** out) {
  return ff::ResolveTarget(
      link->hdr, qp->attr.dest_qp_num, link->pctx->mr_table.as<ff::MrEntry>(), w.rkey,
      w.remote_addr, len, need,
      [&](uint32_t region, uint32_t access) -> const Mapping* {
        Mapping* m = nullptr;
        return PeerRegion(qp, link, region, access, &m) == 0 ? m : nullptr;
      },
      out);
}

Exec Send(Qp* qp, PeerLink* link, SendWqe& w, uint64_t index, ibv_wc_status* st) {
  const ibv_sge* sges = qp->sq.sges_of(index);
  return PutFragments(
      link, w, qp->kind->max_fragment, st, [&](uint32_t frag, bool first, bool last) {
        // The header is passed as a prvalue: it is built in AppendRecord's parameter, not copied.
        const uint8_t flags = SendFlags(w, first, last);
        const ff::RingStatus rs =
            ff::AppendRecord(link->producer, MessageHeader(qp, w, ff::kRecSend, flags), frag,
                             [&](char* dst) { CopyFromSges(sges, w.num_sge, w.sent, dst, frag); });
        if (rs == ff::RingStatus::kOk && last && (flags & ff::kRecSolicited))
          link->solicited = true;
        return rs;
      });
}

// The data goes straight into the peer's memory; WRITE_WITH_IMM then leaves a record that
// completes a receive of the peer.
Exec Write(Qp* qp, PeerLink* link, SendWqe& w, uint64_t index, ibv_wc_status* st) {
  if (!w.started) {
    char* dst = nullptr;
    *st = ResolveTarget(qp, link, w, w.length, IBV_ACCESS_REMOTE_WRITE, &dst);
    if (*st != IBV_WC_SUCCESS) return Exec::kDone;
    if (w.length > 0) CopyFromSges(qp->sq.sges_of(index), w.num_sge, 0, dst, w.length);
    w.started = true;
  }
  if (w.opcode == IBV_WR_RDMA_WRITE) return Exec::kDone;
  const ff::RecordHeader h = MessageHeader(qp, w, ff::kRecWriteImm, WriteImmFlags(w));
  const ff::RingStatus rs = ff::AppendRecord(link->producer, h, nullptr, 0);
  if (rs == ff::RingStatus::kFull) return Exec::kBlocked;
  if (rs == ff::RingStatus::kOk) {
    link->dirty = true;
    link->solicited = link->solicited || (h.flags & ff::kRecSolicited) != 0;
  } else {
    *st = IBV_WC_REM_OP_ERR;
  }
  return Exec::kDone;
}

Exec Read(Qp* qp, PeerLink* link, SendWqe& w, uint64_t index, ibv_wc_status* st) {
  char* src = nullptr;
  *st = ResolveTarget(qp, link, w, w.length, IBV_ACCESS_REMOTE_READ, &src);
  if (*st == IBV_WC_SUCCESS && w.length > 0)
    CopyToSges(qp->sq.sges_of(index), w.num_sge, 0, src, w.length);
  return Exec::kDone;
}

Exec Atomic(Qp* qp, PeerLink* link, SendWqe& w, uint64_t index, ibv_wc_status* st) {
  if ((w.remote_addr & 7) != 0) {
    *st = IBV_WC_REM_INV_REQ_ERR;
    return Exec::kDone;
  }
  char* target = nullptr;
  *st = ResolveTarget(qp, link, w, 8, ff::AtomicAccess(w.opcode), &target);
  if (*st != IBV_WC_SUCCESS) return Exec::kDone;
  const uint64_t old =
      ff::AtomicOp(reinterpret_cast<uint64_t*>(target), w.opcode, w.compare_add, w.swap);
  if (ff::AtomicReturnsOriginal(w.opcode))
    CopyToSges(qp->sq.sges_of(index), w.num_sge, 0, reinterpret_cast<const char*>(&old), 8);
  return Exec::kDone;
}

constexpr OpHandlers kHandlers = {Send, Write, Read, Atomic};

Exec ExecuteSameNode(Qp* qp, PeerLink* link, SendWqe& w, uint64_t index, ibv_wc_status* st) {
  // A datagram claims nothing: its receiver takes a receive for it or drops it. The UD QP's
  // header is shared by all its senders, and a credit counter there would be one any of
  // them could exhaust for the others.
  if (NeedsCredit(w.opcode) && !w.credit && !qp->kind->datagram) {
    if (!ff::ClaimCredit(link->credits, &link->posted_cache)) return NoCredit(qp, link, w, st);
    w.credit = true;
  }
  return Dispatch(kHandlers, qp, link, w, index, st);
}

// Nothing is ever in flight: every WQE finishes in execute.
void NothingInFlight(Qp*, PeerLink*) {}

// A full ring or a missing credit is the peer process's to resolve: nobody to ask.
bool NoRoomToAwait(PeerLink*, Room) { return false; }

}  // namespace

// What the peer published before it went is in our own rings (drained by the caller).
const LinkOps kSameNodeOps = {ExecuteSameNode, NothingInFlight, NothingInFlight,
                              false,           false,           false,
                              NoRoomToAwait,   PublishRing,     ff::TrafficPlacement::kSameNode};

}  // namespace ff::verbs
