// ibv_post_send and the two-phase send queue (see send_queue.h).
#include "datapath/send_queue.h"

#include <algorithm>
#include <mutex>

#include "base/exports.h"
#include "datapath/completion.h"
#include "datapath/link.h"
#include "datapath/recv_path.h"
#include "datapath/send_waits.h"
#include "datapath/sge.h"
#include "session/peer_events.h"
#include "session/session.h"

namespace ff::verbs {
namespace {

bool IsWindowOp(uint32_t op) { return op == IBV_WR_BIND_MW || op == IBV_WR_LOCAL_INV; }

// A BIND_MW names a window of type 2 (type 1 windows are bound through ibv_bind_mw).
bool BindAllowed(const ibv_send_wr* wr, bool type1) {
  if (wr->opcode != IBV_WR_BIND_MW) return true;
  const ibv_mw* mw = wr->bind_mw.mw;
  return mw != nullptr && mw->type == (type1 ? IBV_MW_TYPE_1 : IBV_MW_TYPE_2);
}

uint64_t TotalLength(const ibv_send_wr* wr) {
  uint64_t length = 0;
  for (int i = 0; i < wr->num_sge; ++i) length += wr->sg_list[i].length;
  return length;
}

bool WantsInline(const ibv_send_wr* wr) {
  const uint32_t op = wr->opcode;
  return (wr->send_flags & IBV_SEND_INLINE) &&
         (op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM || op == IBV_WR_SEND_WITH_INV ||
          op == IBV_WR_RDMA_WRITE || op == IBV_WR_RDMA_WRITE_WITH_IMM || op == IBV_WR_ATOMIC_WRITE);
}

// 0 when `wr` may be queued on `qp`, else the errno post_send returns. *length: its bytes.
int CheckWr(const Qp* qp, const ibv_send_wr* wr, bool type1, uint64_t* length) {
  const ff::QpKind& kind = *qp->kind;
  const uint64_t queued = qp->sq.tail - qp->sq.head;
  if (queued > qp->sq.mask || queued >= qp->cap.max_send_wr) return ENOMEM;
  if (IsWindowOp(wr->opcode)) {
    *length = 0;
    return kind.Allows(wr->opcode) && BindAllowed(wr, type1) ? 0 : EINVAL;
  }
  if (!kind.Allows(wr->opcode) || wr->num_sge < 0 ||
      static_cast<uint32_t>(wr->num_sge) > qp->cap.max_send_sge ||
      (kind.datagram && wr->wr.ud.ah == nullptr))
    return EINVAL;
  *length = TotalLength(wr);
  if ((WantsInline(wr) && *length > ff::kMaxInline) || *length > kind.max_message) return EINVAL;
  // An ATOMIC_WRITE stores exactly the 8 bytes its data (SGEs or inline) holds.
  if (wr->opcode == IBV_WR_ATOMIC_WRITE && *length != 8) return EINVAL;
  return 0;
}

// The WQE's data: copied now when inline, else its SGEs (checked against local MRs).
void TakeData(Qp* qp, SendWqe& w, uint64_t index, const ibv_send_wr* wr) {
  ibv_sge* sges = qp->sq.sges_of(index);
  if (WantsInline(wr)) {
    char* buf = qp->sq.inline_of(index);
    CopyFromSges(wr->sg_list, static_cast<uint32_t>(wr->num_sge), 0, buf, w.length);
    sges[0] = ibv_sge{reinterpret_cast<uintptr_t>(buf), static_cast<uint32_t>(w.length), 0};
    w.num_sge = 1;
    return;
  }
  // A WQE without SGEs may come with sg_list null, which memcpy must not be given.
  if (wr->num_sge > 0) std::memcpy(sges, wr->sg_list, sizeof(ibv_sge) * wr->num_sge);
  w.num_sge = static_cast<uint32_t>(wr->num_sge);
  if (!ValidSges(qp->ctx, qp->qpx.qp_base.pd, sges, w.num_sge,
                 IsReadOrAtomic(w.opcode) ? IBV_ACCESS_LOCAL_WRITE : 0))
    w.pre_status = IBV_WC_LOC_PROT_ERR;
}

void TakeAddressing(const Qp* qp, SendWqe& w, const ibv_send_wr* wr) {
  switch (wr->opcode) {
    case IBV_WR_BIND_MW:
      w.mw = wr->bind_mw.mw;
      w.bind_mr = wr->bind_mw.bind_info.mr;
      w.remote_addr = wr->bind_mw.bind_info.addr;
      w.compare_add = wr->bind_mw.bind_info.length;
      w.rkey = wr->bind_mw.rkey;
      w.imm = wr->bind_mw.bind_info.mw_access_flags;
      break;
    case IBV_WR_LOCAL_INV:
      w.rkey = wr->invalidate_rkey;
      break;
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
    case IBV_WR_RDMA_READ:
    case IBV_WR_ATOMIC_WRITE:
      w.remote_addr = wr->wr.rdma.remote_addr;
      w.rkey = wr->wr.rdma.rkey;
      break;
    case IBV_WR_ATOMIC_CMP_AND_SWP:
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
      w.remote_addr = wr->wr.atomic.remote_addr;
      w.rkey = wr->wr.atomic.rkey;
      w.compare_add = wr->wr.atomic.compare_add;
      w.swap = wr->wr.atomic.swap;
      w.length = 8;
      break;
    default:
      break;
  }
  if (qp->kind->datagram) {
    const Ah* ah = ToAh(wr->wr.ud.ah);
    w.dest_ip = ah->ip;
    w.dest_lid = ah->lid;
    w.remote_qpn = wr->wr.ud.remote_qpn;
    // A Q_Key with the high bit set means "use the QP's own Q_Key".
    w.remote_qkey = (wr->wr.ud.remote_qkey & 0x80000000u) ? qp->attr.qkey : wr->wr.ud.remote_qkey;
  }
}

// Every field of the slot is written field by field: `w = SendWqe{}` zeroes the whole WQE with
// a `rep stos`, which profiles of ib_send_bw showed as the most expensive instruction of a post.
void Enqueue(Qp* qp, const ibv_send_wr* wr, uint64_t length) {
  const uint64_t index = qp->sq.tail;
  SendWqe& w = qp->sq.at(index);
  w.wr_id = wr->wr_id;
  w.opcode = wr->opcode;
  w.flags = wr->send_flags;
  w.signaled = qp->sq_sig_all || (wr->send_flags & IBV_SEND_SIGNALED);
  w.length = length;
  w.imm = wr->imm_data;
  w.remote_addr = 0;
  w.rkey = 0;
  w.compare_add = 0;
  w.swap = 0;
  w.dest_ip = 0;
  w.dest_lid = 0;
  w.remote_qpn = 0;
  w.remote_qkey = 0;
  w.sent = 0;
  w.credit = false;
  w.started = false;
  w.rnr = ff::RnrState{};
  w.pre_status = IBV_WC_SUCCESS;
  w.in_flight = false;
  w.done = false;
  w.answered = false;
  w.status = IBV_WC_SUCCESS;
  w.posted_ns = __builtin_expect(SendWaitsOn(), 0) ? ff::MonotonicNs() : 0;
  if (!IsWindowOp(wr->opcode)) TakeData(qp, w, index, wr);
  TakeAddressing(qp, w, wr);
  // The bytes an ATOMIC_WRITE stores are taken now, as the operand of any atomic is.
  if (wr->opcode == IBV_WR_ATOMIC_WRITE && w.pre_status == IBV_WC_SUCCESS)
    CopyFromSges(qp->sq.sges_of(index), w.num_sge, 0, reinterpret_cast<char*>(&w.compare_add), 8);
  ++qp->sq.tail;
}

ibv_wc_opcode SendWcOpcode(uint32_t op) {
  switch (op) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
      return IBV_WC_RDMA_WRITE;
    case IBV_WR_RDMA_READ:
      return IBV_WC_RDMA_READ;
    case IBV_WR_ATOMIC_CMP_AND_SWP:
      return IBV_WC_COMP_SWAP;
    case IBV_WR_ATOMIC_FETCH_AND_ADD:
      return IBV_WC_FETCH_ADD;
    case IBV_WR_ATOMIC_WRITE:
      return IBV_WC_ATOMIC_WRITE;
    case IBV_WR_BIND_MW:
      return IBV_WC_BIND_MW;
    case IBV_WR_LOCAL_INV:
      return IBV_WC_LOCAL_INV;
    default:
      return IBV_WC_SEND;
  }
}

void CompleteSend(Qp* qp, const SendWqe& w, ibv_wc_status st) {
  ibv_wc wc{};
  wc.wr_id = w.wr_id;
  wc.status = st;
  wc.opcode = SendWcOpcode(w.opcode);
  wc.byte_len = static_cast<uint32_t>(w.length);
  wc.qp_num = qp->qpx.qp_base.qp_num;
  // A request the router answered: its response fired the event when it was written.
  PushWc(qp->scq, wc, /*announced=*/w.answered);
}

void UpdatePending(Qp* qp) {
  const bool has = !qp->sq.empty();
  if (has == qp->sq.in_pending_list) return;
  auto& v = qp->ctx->pending;
  if (has) {
    v.push_back(qp);
  } else {
    v.erase(std::remove(v.begin(), v.end(), qp), v.end());
  }
  qp->sq.in_pending_list = has;
}

// Counts `w`, which `link` carried out, in the session's traffic ledger.
void CountCarriedOut(PeerLink* link, const SendWqe& w) {
  switch (w.opcode) {
    case IBV_WR_SEND:
    case IBV_WR_SEND_WITH_IMM:
    case IBV_WR_SEND_WITH_INV:
      link->traffic.Count(ff::TrafficKind::kSend, w.length);
      return;
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
      link->traffic.Count(ff::TrafficKind::kWrite, w.length);
      return;
    case IBV_WR_RDMA_READ:
      link->traffic.Count(ff::TrafficKind::kRead, w.length);
      return;
    default:
      link->traffic.Count(ff::TrafficKind::kAtomic, sizeof(uint64_t));
  }
}

// Runs the WQE through its link. *touched: the link it produced into, if any.
Exec Execute(Qp* qp, SendWqe& w, uint64_t index, ibv_wc_status* st, PeerLink** touched) {
  *st = IBV_WC_SUCCESS;
  if (w.pre_status != IBV_WC_SUCCESS) {
    *st = static_cast<ibv_wc_status>(w.pre_status);
    return Exec::kDone;
  }
  if (IsWindowOp(w.opcode)) {
    *st = ExecuteWindowOp(qp, w);
    return Exec::kDone;
  }
  PeerLink* link = qp->kind->datagram ? UdLink(qp, w) : qp->conn.link.get();
  if (link == nullptr && qp->conn.awaited.waiting) {
    const Exec e = AwaitPeer(qp, st);
    if (qp->conn.link == nullptr) return e;
    link = qp->conn.link.get();
  }
  if (link == nullptr || link->dead) {
    // UD to an unknown destination is dropped, as on a real fabric; RC and UC retry until
    // their budget runs out.
    if (!qp->kind->datagram) {
      *st = IBV_WC_RETRY_EXC_ERR;
      HoldPeerError(qp);
    } else if (link != nullptr) {
      *st = IBV_WC_RETRY_EXC_ERR;
    }
    return Exec::kDone;
  }
  *touched = link;
  return link->ops->execute(qp, link, w, index, st);
}

void PublishLink(PeerLink* link) {
  if (!link->dirty) return;
  link->ops->publish(link);
  link->dirty = false;
}

// The links one pass produced into, published together at its end (one wake-up each).
struct TouchedLinks {
  PeerLink* links[ff::kMaxBatchedLinks];
  int n = 0;

  void Add(PeerLink* link) {
    if (link == nullptr || !link->dirty) return;
    for (int i = 0; i < n; ++i)
      if (links[i] == link) return;
    if (n == ff::kMaxBatchedLinks) {
      PublishLink(links[0]);
      links[0] = link;
      return;
    }
    links[n++] = link;
  }
  void PublishAll() {
    for (int i = 0; i < n; ++i) PublishLink(links[i]);
  }
};

// Takes in what came back, then executes what can be executed, in order. Returns the link
// the next WQE is blocked on, or nullptr (none is, or it waits for no link: consent).
PeerLink* ExecuteQueued(Qp* qp) {
  SendQueue& sq = qp->sq;
  if (sq.inflight > 0 && qp->conn.link) qp->conn.link->ops->collect(qp, qp->conn.link.get());
  if (sq.peer_error_due_ns != 0) return nullptr;  // the QP is about to fail
  TouchedLinks touched;
  PeerLink* blocked = nullptr;
  while (sq.exec != sq.tail) {
    SendWqe& w = sq.at(sq.exec);
    ibv_wc_status st = IBV_WC_SUCCESS;
    PeerLink* link = nullptr;
    const Exec e = Execute(qp, w, sq.exec, &st, &link);
    touched.Add(link);
    if (e == Exec::kBlocked) {
      blocked = link;
      break;
    }
    if (link != nullptr && (e == Exec::kInFlight || st == IBV_WC_SUCCESS)) CountCarriedOut(link, w);
    if (e == Exec::kInFlight) {
      w.in_flight = true;
      ++sq.inflight;
    } else {
      w.done = true;
      w.status = st;
    }
    ++sq.exec;
    if (st != IBV_WC_SUCCESS && qp->kind->error_fails_qp) break;  // retired below as an error
  }
  touched.PublishAll();
  return blocked;
}

// When the event thread must look at a stalled QP again at the latest: when the RNR retry
// budget of its first WQE may run out (rnr_retry 7 retries forever), or when a connect that
// awaits the peer's consent is retried (and its deadline checked).
uint64_t StallDue(const Qp* qp) {
  if (qp->sq.peer_error_due_ns != 0) return qp->sq.peer_error_due_ns;
  if (qp->conn.link == nullptr && qp->conn.awaited.waiting) return qp->conn.awaited.next_ns;
  const SendWqe& w = qp->sq.at(qp->sq.exec);
  if (!w.credit && w.rnr.deadline_ns != 0 && qp->attr.rnr_retry != 7) return w.rnr.deadline_ns;
  return UINT64_MAX;
}

// A WQE waits for something only this process will look at again: a peer process on this
// node frees ring room and posts receives without telling us, and consent is retried by us.
// The program may never call again (it may wait on memory the peer writes once the data
// arrived), so the event thread is asked to advance the queue (Registry::Tick); the first
// stall of the context since it last found none wakes it. Never on the fast path.
[[gnu::noinline]] void NoteStalled(Qp* qp) {
  qp->sq.stalled = true;
  qp->sq.stall_due_ns = StallDue(qp);
  Context* ctx = qp->ctx;
  if (!ctx->stalled.load(std::memory_order_relaxed) &&
      !ctx->stalled.exchange(true, std::memory_order_acq_rel))
    ff::SendWake(ctx->session->tick_tx.get());
}

}  // namespace

void PublishRing(PeerLink* link) {
  link->producer.Publish();
  ff::WakeIfArmed(link->notify, link->notify_fd.get(), link->solicited);
  link->solicited = false;
}

void Progress(Qp* qp) {
  if (qp->qpx.qp_base.state == IBV_QPS_ERR) {
    qp->sq.stalled = false;
    FailQp(qp, IBV_WC_WR_FLUSH_ERR);
    return;
  }
  // A WQE left blocked may never be looked at again by this thread: the program may wait
  // on memory the peer writes rather than call us. So its link is asked to have it advanced
  // when room is made, and since room may have been made just before it asked, the queue
  // is looked at once more (at most once per link, which asks only once).
  PeerLink* blocked = ExecuteQueued(qp);
  while (blocked != nullptr && blocked->ops->await_room(blocked, Room::kLacking))
    blocked = ExecuteQueued(qp);
  if (blocked == nullptr && qp->conn.link)
    qp->conn.link->ops->await_room(qp->conn.link.get(), Room::kEnough);
  if (Retire(qp)) UpdatePending(qp);
  // Waiting on a router link is the router's to end (kProxyDrained); anything else left
  // unexecuted stalls.
  if (__builtin_expect(qp->sq.peer_error_due_ns != 0, 0) ||
      (__builtin_expect(qp->sq.exec != qp->sq.tail, 0) &&
       (blocked == nullptr || !blocked->ops->room_nudged))) {
    NoteStalled(qp);
  } else {
    qp->sq.stalled = false;
  }
}

void ResumeSends(Qp* qp) {
  Connection& c = qp->conn;
  if (c.link) c.link->ops->await_room(c.link.get(), Room::kNudgeTaken);
  for (auto& [dest, link] : c.ud_links) link->ops->await_room(link.get(), Room::kNudgeTaken);
  if (qp->sq.in_pending_list) Progress(qp);
}

void HoldPeerError(Qp* qp) {
  uint64_t& due = qp->sq.peer_error_due_ns;
  if (due == 0) due = RetryExhaustedAt(qp, ff::MonotonicNs());
}

bool Retire(Qp* qp) {
  SendQueue& sq = qp->sq;
  while (sq.head != sq.exec) {
    SendWqe& w = sq.at(sq.head);
    if (!w.done) break;
    const auto st = static_cast<ibv_wc_status>(w.status);
    if (st == IBV_WC_RETRY_EXC_ERR && sq.peer_error_due_ns != 0) {
      if (ff::MonotonicNs() < sq.peer_error_due_ns) {
        w.answered = false;  // whoever completes it later fires the CQ event
        break;
      }
      sq.peer_error_due_ns = 0;
    }
    if (st != IBV_WC_SUCCESS || w.signaled) CompleteSend(qp, w, st);
    ++sq.head;
    if (__builtin_expect(w.posted_ns != 0, 0)) {
      // It waited at the head from its post, or from its predecessor's retirement.
      const uint64_t now = ff::MonotonicNs();
      NoteSendWait(qp->qpx.qp_base.qp_num, now - std::max(w.posted_ns, sq.last_retired_ns));
      sq.last_retired_ns = now;
    }
    if (st != IBV_WC_SUCCESS && qp->kind->error_fails_qp) {
      // A transport error moves the QP to the error state and flushes the rest.
      MoveToError(qp, IBV_WC_WR_FLUSH_ERR);
      return false;
    }
  }
  return true;
}

void ProgressPending(Context* ctx) {
  ctx->passes.store(ctx->passes.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  // Backwards: Progress() may take the QP it runs (and only that one) off the list.
  for (size_t i = ctx->pending.size(); i-- > 0;) {
    if (i < ctx->pending.size()) Progress(ctx->pending[i]);
  }
}

void FailQp(Qp* qp, ibv_wc_status first) {
  SendQueue& sq = qp->sq;
  while (!sq.empty()) {
    CompleteSend(qp, sq.at(sq.head), first);
    first = IBV_WC_WR_FLUSH_ERR;
    ++sq.head;
  }
  sq.Forget();
  FlushRecvs(qp);
  UpdatePending(qp);
}

void MoveToError(Qp* qp, ibv_wc_status first_status) {
  const ibv_qp_state was = qp->qpx.qp_base.state;
  qp->qpx.qp_base.state = IBV_QPS_ERR;
  qp->attr.qp_state = IBV_QPS_ERR;
  // In ERR first: a ring found corrupt meanwhile fails the QP without coming back here.
  if (was >= IBV_QPS_RTR && was <= IBV_QPS_SQE) DeliverArrived(qp);
  FailQp(qp, first_status);
  // As a real device tells the owner of an SRQ's QP that the QP has flushed: the program may
  // now destroy it knowing no receive of the SRQ will complete on it any more.
  if (qp->srq != nullptr && !qp->last_wqe_reached) {
    qp->last_wqe_reached = true;
    PushAsyncEvent(qp->ctx, IBV_EVENT_QP_LAST_WQE_REACHED, &qp->qpx.qp_base);
  }
}

void ResetQueues(Qp* qp) {
  qp->last_wqe_reached = false;
  qp->sq.Forget();
  ResetRecv(qp);
  UpdatePending(qp);
}

namespace {

int PostList(ibv_qp* ibqp, ibv_send_wr* wr, bool type1, ibv_send_wr** bad) {
  Qp* qp = ToQp(ibqp);
  Context* ctx = qp->ctx;
  std::lock_guard<AdaptiveLock> l(ctx->lock);
  return Guarded([&] {
    if (ctx->attention.load(std::memory_order_relaxed)) HandleAttention(ctx);
    const ibv_qp_state state = ibqp->state;
    if (state != IBV_QPS_RTS && state != IBV_QPS_ERR) {
      *bad = wr;
      return EINVAL;
    }
    int rc = 0;
    for (; wr != nullptr; wr = wr->next) {
      uint64_t length = 0;
      rc = CheckWr(qp, wr, type1, &length);
      if (rc != 0) {
        *bad = wr;
        break;
      }
      Enqueue(qp, wr, length);
    }
    Progress(qp);
    return rc;
  });
}

}  // namespace

int PostSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
  return PostList(qp, wr, false, bad);
}

int PostBindType1(ibv_qp* qp, ibv_send_wr* wr) {
  ibv_send_wr* bad = nullptr;
  return PostList(qp, wr, true, &bad);
}

}  // namespace ff::verbs
