// Links to a peer on another node (kRouterOps). The router answered the connect with a
// proxy segment: every work request becomes request records in its kProxyRequestRing (SEND
// payload, WRITE payload, READ request, ATOMIC request; each a ProxyRequest naming the WQE
// by `seq`), and the router rings back on kProxyResponseRing with the outcome, READ data and
// atomic results. Requests stay in flight until then; the send queue retires them in order.
// The router's doorbell is written only when it armed it (after publishing, send_queue.cc).
#include <algorithm>

#include "datapath/link.h"
#include "datapath/send_queue.h"
#include "datapath/sge.h"

namespace ff::verbs {
namespace {


// One request record: its headers, then `data_len` bytes of the WQE's data from `data_off`.
ff::RingStatus AppendReq(Qp* qp, PeerLink* link, const SendWqe& w, uint64_t index, uint8_t kind,
                         uint8_t flags, const ff::ProxyRequest& op, uint64_t data_off,
                         uint32_t data_len) {
  const ff::RingStatus rs = ff::AppendRequest(
      link->producer, MessageHeader(qp, w, kind, flags), op, data_len,
      [&](char* dst) { CopyFromSges(qp->sq.sges_of(index), w.num_sge, data_off, dst, data_len); });
  if (rs == ff::RingStatus::kOk) link->dirty = true;
  return rs;
}

// A request without data of its own (WRITE_WITH_IMM's immediate, READ, ATOMIC).
Exec AppendSingle(Qp* qp, PeerLink* link, const SendWqe& w, uint64_t index, uint8_t kind,
                  uint8_t flags, const ff::ProxyRequest& op, ibv_wc_status* st) {
  const ff::RingStatus rs = AppendReq(qp, link, w, index, kind, flags, op, 0, 0);
  if (rs == ff::RingStatus::kFull) return Exec::kBlocked;
  if (rs == ff::RingStatus::kOk) return Exec::kInFlight;
  *st = IBV_WC_REM_OP_ERR;
  return Exec::kDone;
}

Exec SendRequests(Qp* qp, PeerLink* link, SendWqe& w, uint64_t index, ibv_wc_status* st) {
  ff::ProxyRequest op = RequestOf(qp, w, index);
  const uint32_t max_frag = qp->kind->max_fragment;
  const Exec e = PutFragments(link, w, max_frag, st, [&](uint32_t frag, bool first, bool last) {
    op.last = last ? 1 : 0;
    return AppendReq(qp, link, w, index, ff::kRecSend, SendFlags(w, first, last), op, w.sent, frag);
  });
  if (e != Exec::kDone || *st != IBV_WC_SUCCESS) return e;
  // A datagram is not answered: it completes once it left.
  return qp->kind->answered ? Exec::kInFlight : Exec::kDone;
}

Exec WriteRequests(Qp* qp, PeerLink* link, SendWqe& w, uint64_t index, ibv_wc_status* st) {
  ff::ProxyRequest op = RequestOf(qp, w, index);
  const bool with_imm = w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
  const Exec e = PutFragments(link, w, ff::kMaxFragment, st, [&](uint32_t frag, bool, bool last) {
    op.remote_addr = w.remote_addr + w.sent;
    op.last = !with_imm && last ? 1 : 0;
    return AppendReq(qp, link, w, index, ff::kRecWrite, 0, op, w.sent, frag);
  });
  if (e != Exec::kDone || *st != IBV_WC_SUCCESS) return e;
  if (!with_imm) return Exec::kInFlight;
  op.last = 1;
  return AppendSingle(qp, link, w, index, ff::kRecWriteImm, WriteImmFlags(w), op, st);
}

Exec ReadOrAtomicRequest(Qp* qp, PeerLink* link, SendWqe& w, uint64_t index, ibv_wc_status* st) {
  // As an HCA does: at most max_rd_atomic READs/atomics outstanding per QP (an ATOMIC_WRITE
  // is not one of them: it goes as a WRITE does).
  const bool counted = IsReadOrAtomic(w.opcode);
  if (counted && qp->sq.reads_inflight >= std::max<uint32_t>(1, qp->attr.max_rd_atomic))
    return Exec::kBlocked;
  ff::ProxyRequest op = RequestOf(qp, w, index);
  op.last = 1;
  const uint8_t kind = w.opcode == IBV_WR_RDMA_READ ? ff::kRecReadReq : ff::kRecAtomicReq;
  const Exec e = AppendSingle(qp, link, w, index, kind, 0, op, st);
  if (e == Exec::kInFlight && counted) ++qp->sq.reads_inflight;
  return e;
}

constexpr OpHandlers kHandlers = {SendRequests, WriteRequests, ReadOrAtomicRequest,
                                  ReadOrAtomicRequest};

Exec ExecuteThroughRouter(Qp* qp, PeerLink* link, SendWqe& w, uint64_t index, ibv_wc_status* st) {
  return Dispatch(kHandlers, qp, link, w, index, st);
}

// `announced`: whoever wrote the answer fired the send CQ's event (the router does).
void Finish(Qp* qp, SendWqe& w, uint32_t status, bool announced = true) {
  w.in_flight = false;
  w.done = true;
  w.answered = announced;
  w.status = status;
  --qp->sq.inflight;
  if (IsReadOrAtomic(w.opcode)) --qp->sq.reads_inflight;
}

}  // namespace

void FailInFlight(Qp* qp, PeerLink* link) {
  link->dead = true;
  for (uint64_t i = qp->sq.head; i != qp->sq.exec; ++i) {
    SendWqe& w = qp->sq.at(i);
    if (w.in_flight) Finish(qp, w, IBV_WC_RETRY_EXC_ERR, false);
  }
}

// Responses for WQEs no longer in flight (stale after a flush, or duplicates) are ignored,
// and so is data that does not fit the WQE's buffer.
void ApplyProxyResponse(Qp* qp, const ff::ResponseView& v, bool announced) {
  const ff::ProxyResponse& r = v.resp;
  SendQueue& sq = qp->sq;
  const uint64_t index = sq.head + static_cast<uint32_t>(r.seq - static_cast<uint32_t>(sq.head));
  if (index >= sq.exec) return;
  SendWqe& w = sq.at(index);
  if (!w.in_flight) return;
  if (v.data_len > 0 && r.status == IBV_WC_SUCCESS && r.data_offset <= w.length &&
      v.data_len <= w.length - r.data_offset)
    CopyToSges(qp->sq.sges_of(index), w.num_sge, r.data_offset, v.data, v.data_len);
  if (!r.last) return;
  Finish(qp, w, r.status, announced);
  // The router answers so for a peer QP that is gone: a real requester would retry first.
  if (r.status == IBV_WC_RETRY_EXC_ERR) HoldPeerError(qp);
}

namespace {

// The router broke its ring: no answer will come, so nothing may wait for one.
void AbandonInFlight(Qp* qp, PeerLink* link) {
  LogError("QP 0x%x: the router corrupted its response ring; failing the connection",
           qp->qpx.qp_base.qp_num);
  FailInFlight(qp, link);
}

void CollectResponses(Qp* qp, PeerLink* link) {
  ff::RingConsumer& cons = link->responses;
  bool consumed = false;
  for (int budget = 0; budget < ff::kDrainBudget; ++budget) {
    ff::RecordHeader h;
    const char* payload = nullptr;
    const ff::RingStatus rs = cons.Peek(&h, &payload);
    if (rs == ff::RingStatus::kCorrupt) AbandonInFlight(qp, link);
    if (rs != ff::RingStatus::kOk) break;
    consumed = true;
    cons.Consume(h);
    ff::ResponseView v;
    if (ff::DecodeResponse(h, payload, &v)) ApplyProxyResponse(qp, v, true);
  }
  if (consumed) cons.Release();
}

// The router makes room (drains the request ring, answers READs) on its own; a WQE that
// found none waits here until this process calls the library again, or until the router,
// asked through `sends_waiting`, has the event thread advance it (peer_events.cc). The word
// leaves kSendsNudged only here, with kNudgeTaken: at most one nudge is on its way.
bool AwaitRoom(PeerLink* link, Room room) {
  std::atomic<uint32_t>& word = link->hdr->sends_waiting;
  switch (room) {
    case Room::kLacking: {
      uint32_t idle = 0;
      return word.compare_exchange_strong(idle, ff::kSendsWaiting, std::memory_order_seq_cst);
    }
    case Room::kEnough: {
      uint32_t waiting = ff::kSendsWaiting;
      if (word.load(std::memory_order_relaxed) == waiting)
        word.compare_exchange_strong(waiting, 0, std::memory_order_relaxed);
      return false;
    }
    case Room::kNudgeTaken:
      if (word.load(std::memory_order_relaxed) != 0) word.store(0, std::memory_order_relaxed);
      return false;
  }
  return false;
}

}  // namespace

// When the peer goes, the outcomes the router already wrote back still count.
const LinkOps kRouterOps = {ExecuteThroughRouter,
                            CollectResponses,
                            CollectResponses,
                            true,
                            true,
                            true,
                            AwaitRoom,
                            PublishRing,
                            ff::TrafficPlacement::kRelay};

}  // namespace ff::verbs
