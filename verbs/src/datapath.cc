// The data path: post_send, post_recv, poll_cq and completion events.
//
// Same-node transfers never involve the router. A SEND claims a receive credit of the
// peer's receive queue and copies the payload into the peer QP's inbound ring; the
// receiver turns ring records into completions when it polls. RDMA WRITE, READ and
// ATOMIC operate directly on the target's registered memory (mapped through the router
// on first use), after checking the target's MR table: the target process does nothing.
// None of this makes a system call unless a completion channel must be woken.
#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <cstdlib>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "exports.h"
#include "freeflow/ipv4.h"
#include "freeflow/target_ops.h"

namespace ffv {
namespace {

enum class Exec { kDone, kBlocked, kInFlight };

inline bool CqFull(const Cq* cq) { return cq->tail - cq->head > cq->mask; }

void Signal(int fd) {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(fd, &one, sizeof(one));
}

// A completion was added to `cq` by its owner.
inline void NotifyLocal(Cq* cq) {
  if (cq->notify_slot == ff::proto::kNoId) return;
  ff::NotifySlot* slot = cq->ctx->session->notify.as<ff::NotifySlot>() + cq->notify_slot;
  if (slot->armed.load(std::memory_order_relaxed) && slot->armed.exchange(0)) {
    slot->fired.store(1, std::memory_order_release);
    Signal(cq->channel->ch.fd);
  }
}

void PushWc(Cq* cq, const ibv_wc& wc) {
  if (CqFull(cq)) {
    if (!cq->overflowed) {
      cq->overflowed = true;
      LogError("completion queue overflow (%u entries); completions are being lost",
               cq->capacity);
      PushAsyncEvent(cq->ctx, IBV_EVENT_CQ_ERR, &cq->cq);
    }
    return;
  }
  cq->wcs[cq->tail & cq->mask] = wc;
  ++cq->tail;
  NotifyLocal(cq);
}

void CopyFromSges(const ibv_sge* sges, uint32_t n, uint64_t offset, char* dst, uint64_t len) {
  for (uint32_t i = 0; i < n && len > 0; ++i) {
    if (offset >= sges[i].length) {
      offset -= sges[i].length;
      continue;
    }
    const uint64_t take = std::min<uint64_t>(sges[i].length - offset, len);
    std::memcpy(dst, reinterpret_cast<const char*>(sges[i].addr) + offset, take);
    dst += take;
    len -= take;
    offset = 0;
  }
}

void CopyToSges(const ibv_sge* sges, uint32_t n, uint64_t offset, const char* src, uint64_t len) {
  for (uint32_t i = 0; i < n && len > 0; ++i) {
    if (offset >= sges[i].length) {
      offset -= sges[i].length;
      continue;
    }
    const uint64_t take = std::min<uint64_t>(sges[i].length - offset, len);
    std::memcpy(reinterpret_cast<char*>(sges[i].addr) + offset, src, take);
    src += take;
    len -= take;
    offset = 0;
  }
}

// Checks that every SGE lies inside a local registration with `lkey` and `need` access.
bool ValidSges(Context* ctx, const ibv_sge* sges, uint32_t n, int need) {
  for (uint32_t i = 0; i < n; ++i) {
    if (sges[i].length == 0) continue;
    const Mr* mr = ctx->last_mr;
    if (mr == nullptr || mr->mr.lkey != sges[i].lkey) {
      const uint32_t slot = ff::MrSlotOfKey(sges[i].lkey);
      if (slot >= ctx->mrs_by_slot.size()) return false;
      mr = ctx->mrs_by_slot[slot];
      if (mr == nullptr || mr->mr.lkey != sges[i].lkey) return false;
      ctx->last_mr = mr;
    }
    const uint64_t base = reinterpret_cast<uintptr_t>(mr->mr.addr);
    if (sges[i].addr < base || sges[i].length > mr->mr.length ||
        sges[i].addr - base > mr->mr.length - sges[i].length)
      return false;
    if ((mr->access & need) != need) return false;
  }
  return true;
}

ibv_wc_status ResolveRemote(Qp* qp, PeerLink* link, uint32_t rkey, uint64_t addr, uint64_t len,
                            uint32_t need, char** out) {
  ff::MrView v;
  const ibv_wc_status st = ff::CheckRemoteAccess(
      link->hdr, link->pctx->mr_table.as<ff::MrEntry>(), rkey, addr, len, need, &v);
  if (st != IBV_WC_SUCCESS) return st;
  Mapping* m = PeerRegion(qp, link, v.region);
  if (m == nullptr) return IBV_WC_REM_ACCESS_ERR;
  const int64_t off = ff::RegionOffset(v, addr, len, m->size());
  if (off < 0) return IBV_WC_REM_ACCESS_ERR;
  *out = m->as<char>() + off;
  return IBV_WC_SUCCESS;
}

bool ClaimCredit(PeerLink* link) { return ff::ClaimCredit(link->credits, &link->posted_cache); }

ibv_sge* WqeSges(Qp* qp, uint64_t index) {
  return &qp->sq_sges[(index & qp->sq_mask) * qp->cap.max_send_sge];
}

PeerLink* UdLink(Qp* qp, const SendWqe& w) {
  const uint64_t key = (static_cast<uint64_t>(w.dest_ip != 0 ? w.dest_ip : w.dest_lid) << 32) |
                       w.remote_qpn;
  auto it = qp->ud_links.find(key);
  if (it != qp->ud_links.end()) return it->second.get();
  std::unique_ptr<PeerLink> link;
  if (ConnectLink(qp, w.dest_ip, w.dest_lid, w.remote_qpn, true, &link) != 0) return nullptr;
  PeerLink* raw = link.get();
  if (raw->remote) ++qp->ctx->remote_links;
  qp->ud_links.emplace(key, std::move(link));
  return raw;
}

// Writes the message records of a SEND / SEND_WITH_IMM. kBlocked when the ring is full.
Exec SendRecords(Qp* qp, PeerLink* link, SendWqe& w, uint64_t index, ibv_wc_status* st) {
  const ibv_sge* sges = WqeSges(qp, index);
  const uint32_t max_frag = qp->type == IBV_QPT_UD ? ff::kMtu : ff::kMaxFragment;
  do {
    const uint32_t frag = static_cast<uint32_t>(std::min<uint64_t>(w.length - w.sent, max_frag));
    const uint32_t total = ff::RecordBytes(frag);
    char* p = nullptr;
    const ff::RingStatus rs = link->producer.Reserve(total, &p);
    if (rs == ff::RingStatus::kFull) return Exec::kBlocked;
    if (rs == ff::RingStatus::kCorrupt) {
      *st = IBV_WC_REM_OP_ERR;
      return Exec::kDone;
    }
    auto* h = reinterpret_cast<ff::RecordHeader*>(p);
    h->total = total;
    h->kind = ff::kRecSend;
    h->flags = static_cast<uint8_t>((w.started ? 0 : ff::kRecFirst) |
                                    (w.sent + frag == w.length ? ff::kRecLast : 0) |
                                    (w.opcode == IBV_WR_SEND_WITH_IMM ? ff::kRecImm : 0) |
                                    ((w.flags & IBV_SEND_SOLICITED) ? ff::kRecSolicited : 0));
    h->reserved = 0;
    h->msg_len = static_cast<uint32_t>(w.length);
    h->imm = w.imm;
    h->src_qpn = qp->qpx.qp_base.qp_num;
    h->src_ip = htonl(qp->ctx->session->ip);
    h->frag_len = frag;
    h->qkey = w.remote_qkey;
    CopyFromSges(sges, w.num_sge, w.sent, p + sizeof(ff::RecordHeader), frag);
    link->producer.Commit(total);
    w.sent += frag;
    w.started = true;
    if (frag == max_frag) link->producer.Publish();  // let the receiver start on long messages
    link->dirty = true;
  } while (w.sent < w.length);
  return Exec::kDone;
}

// Writes one request record into a proxy ring: its headers, then `data_len` bytes of the
// WQE's data starting at `data_off` (inline or gathered from its SGEs).
ff::RingStatus ProxyRecord(Qp* qp, PeerLink* link, const SendWqe& w, uint64_t index,
                           uint8_t kind, uint8_t flags, const ff::ProxyRequest& op,
                           uint64_t data_off, uint32_t data_len) {
  ff::RecordHeader h{};
  h.kind = kind;
  h.flags = flags;
  h.msg_len = static_cast<uint32_t>(w.length);
  h.imm = w.imm;
  h.src_qpn = qp->qpx.qp_base.qp_num;
  h.src_ip = htonl(qp->ctx->session->ip);
  h.qkey = w.remote_qkey;
  const ff::RingStatus rs = ff::AppendRequest(link->producer, h, op, data_len, [&](char* dst) {
    CopyFromSges(WqeSges(qp, index), w.num_sge, data_off, dst, data_len);
  });
  if (rs == ff::RingStatus::kOk) link->dirty = true;
  return rs;
}

// A peer on another node: the work request becomes records in the router's proxy ring;
// the remote router executes it against the target and answers with a kRecResp.
Exec ExecuteRemote(Qp* qp, PeerLink* link, SendWqe& w, uint64_t index, ibv_wc_status* st) {
  ff::ProxyRequest op{};
  op.seq = static_cast<uint32_t>(index);
  op.opcode = static_cast<uint8_t>(w.opcode);
  op.length = static_cast<uint32_t>(w.length);
  op.rkey = w.rkey;
  op.rnr_retry = static_cast<uint8_t>(qp->attr.rnr_retry);
  auto check = [&](ff::RingStatus rs) {
    if (rs == ff::RingStatus::kCorrupt) *st = IBV_WC_REM_OP_ERR;
    return rs;
  };
  switch (w.opcode) {
    case IBV_WR_SEND:
    case IBV_WR_SEND_WITH_IMM: {
      const uint32_t max_frag = qp->type == IBV_QPT_UD ? ff::kMtu : ff::kMaxFragment;
      do {
        const uint32_t frag =
            static_cast<uint32_t>(std::min<uint64_t>(w.length - w.sent, max_frag));
        const bool last = w.sent + frag == w.length;
        op.last = last ? 1 : 0;
        const uint8_t flags =
            static_cast<uint8_t>((w.started ? 0 : ff::kRecFirst) | (last ? ff::kRecLast : 0) |
                                 (w.opcode == IBV_WR_SEND_WITH_IMM ? ff::kRecImm : 0) |
                                 ((w.flags & IBV_SEND_SOLICITED) ? ff::kRecSolicited : 0));
        const ff::RingStatus rs =
            check(ProxyRecord(qp, link, w, index, ff::kRecSend, flags, op, w.sent, frag));
        if (rs == ff::RingStatus::kFull) return Exec::kBlocked;
        if (rs != ff::RingStatus::kOk) return Exec::kDone;
        w.sent += frag;
        w.started = true;
        if (frag == max_frag) link->producer.Publish();
      } while (w.sent < w.length);
      // UD is unacknowledged: it completes once it left.
      return qp->type == IBV_QPT_UD ? Exec::kDone : Exec::kInFlight;
    }
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM: {
      while (w.phase == 0 && (w.sent < w.length || !w.started)) {
        const uint32_t frag =
            static_cast<uint32_t>(std::min<uint64_t>(w.length - w.sent, ff::kMaxFragment));
        op.remote_addr = w.remote_addr + w.sent;
        op.last = (w.opcode == IBV_WR_RDMA_WRITE && w.sent + frag == w.length) ? 1 : 0;
        const ff::RingStatus rs =
            check(ProxyRecord(qp, link, w, index, ff::kRecWrite, 0, op, w.sent, frag));
        if (rs == ff::RingStatus::kFull) return Exec::kBlocked;
        if (rs != ff::RingStatus::kOk) return Exec::kDone;
        w.sent += frag;
        w.started = true;
        if (frag == ff::kMaxFragment) link->producer.Publish();
      }
      w.phase = 1;
      if (w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM) {
        op.remote_addr = w.remote_addr;
        op.last = 1;
        const ff::RingStatus rs = check(ProxyRecord(
            qp, link, w, index, ff::kRecWriteImm, ff::kRecFirst | ff::kRecLast | ff::kRecImm, op,
            0, 0));
        if (rs == ff::RingStatus::kFull) return Exec::kBlocked;
        if (rs != ff::RingStatus::kOk) return Exec::kDone;
      }
      return Exec::kInFlight;
    }
    case IBV_WR_RDMA_READ:
    case IBV_WR_ATOMIC_CMP_AND_SWP:
    case IBV_WR_ATOMIC_FETCH_AND_ADD: {
      // As an HCA does: at most max_rd_atomic READs/atomics outstanding per QP.
      if (qp->remote_reads >= std::max<uint32_t>(1, qp->attr.max_rd_atomic)) return Exec::kBlocked;
      op.remote_addr = w.remote_addr;
      op.compare_add = w.compare_add;
      op.swap = w.swap;  // atomics: the swap operand
      op.last = 1;
      const uint8_t kind = w.opcode == IBV_WR_RDMA_READ ? ff::kRecReadReq : ff::kRecAtomicReq;
      const ff::RingStatus rs = check(ProxyRecord(qp, link, w, index, kind, 0, op, 0, 0));
      if (rs == ff::RingStatus::kFull) return Exec::kBlocked;
      if (rs != ff::RingStatus::kOk) return Exec::kDone;
      ++qp->remote_reads;
      return Exec::kInFlight;
    }
    default:
      *st = IBV_WC_LOC_QP_OP_ERR;
      return Exec::kDone;
  }
}

// Applies the router's responses to in-flight work requests of `qp`.
void DrainResponses(Qp* qp, PeerLink* link) {
  ff::RingConsumer& cons = link->responses;
  bool consumed = false;
  for (int budget = 0; budget < 4096; ++budget) {
    ff::RecordHeader h;
    const char* payload = nullptr;
    const ff::RingStatus rs = cons.Peek(&h, &payload);
    if (rs != ff::RingStatus::kOk) {
      if (rs == ff::RingStatus::kCorrupt) link->dead = true;
      break;
    }
    consumed = true;
    cons.Consume(h);
    ff::ResponseView v;
    if (!ff::DecodeResponse(h, payload, &v)) continue;
    const ff::ProxyResponse& op = v.resp;
    const uint64_t index = qp->sq_head + static_cast<uint32_t>(op.seq - static_cast<uint32_t>(qp->sq_head));
    if (index >= qp->sq_exec) continue;  // stale: the QP was flushed meanwhile
    SendWqe& w = qp->sq[index & qp->sq_mask];
    if (!w.in_flight) continue;
    const uint32_t dlen = v.data_len;
    if (dlen > 0 && op.status == IBV_WC_SUCCESS && op.data_offset <= w.length &&
        dlen <= w.length - op.data_offset) {
      CopyToSges(WqeSges(qp, index), w.num_sge, op.data_offset, v.data, dlen);
    }
    if (op.last) {
      w.in_flight = false;
      w.done = true;
      w.status = op.status;
      --qp->remote_inflight;
      if (w.opcode == IBV_WR_RDMA_READ || w.opcode == IBV_WR_ATOMIC_CMP_AND_SWP ||
          w.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD)
        --qp->remote_reads;
    }
  }
  if (consumed) cons.Release();
}

Exec Execute(Qp* qp, SendWqe& w, uint64_t index, ibv_wc_status* st, PeerLink** touched) {
  *st = IBV_WC_SUCCESS;
  if (w.pre_status != IBV_WC_SUCCESS) {
    *st = static_cast<ibv_wc_status>(w.pre_status);
    return Exec::kDone;
  }
  PeerLink* link = qp->type == IBV_QPT_UD ? UdLink(qp, w) : qp->link.get();
  if (link == nullptr) {
    // UD to an unknown destination is dropped, as on a real fabric.
    if (qp->type != IBV_QPT_UD) *st = IBV_WC_RETRY_EXC_ERR;
    return Exec::kDone;
  }
  if (link->dead) {
    *st = IBV_WC_RETRY_EXC_ERR;
    return Exec::kDone;
  }
  *touched = link;
  if (link->remote) return ExecuteRemote(qp, link, w, index, st);
  const bool needs_credit = w.opcode == IBV_WR_SEND || w.opcode == IBV_WR_SEND_WITH_IMM ||
                            w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
  if (needs_credit && !w.credit) {
    if (!ClaimCredit(link)) {
      if (qp->type != IBV_QPT_RC) return Exec::kDone;  // UC/UD: the message is dropped
      if (ff::RnrRetryExhausted(&w.rnr, link->hdr->min_rnr_timer.load(std::memory_order_relaxed),
                                qp->attr.rnr_retry, ff::MonotonicNs()))
        *st = IBV_WC_RNR_RETRY_EXC_ERR;
      return *st == IBV_WC_SUCCESS ? Exec::kBlocked : Exec::kDone;
    }
    w.credit = true;
  }
  switch (w.opcode) {
    case IBV_WR_SEND:
    case IBV_WR_SEND_WITH_IMM:
      return SendRecords(qp, link, w, index, st);
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM: {
      if (!w.started) {
        char* dst = nullptr;
        *st = ResolveRemote(qp, link, w.rkey, w.remote_addr, w.length, IBV_ACCESS_REMOTE_WRITE,
                            &dst);
        if (*st != IBV_WC_SUCCESS) return Exec::kDone;
        CopyFromSges(WqeSges(qp, index), w.num_sge, 0, dst, w.length);
        w.started = true;
      }
      if (w.opcode == IBV_WR_RDMA_WRITE) return Exec::kDone;
      char* p = nullptr;
      const uint32_t total = ff::RecordBytes(0);
      const ff::RingStatus rs = link->producer.Reserve(total, &p);
      if (rs == ff::RingStatus::kFull) return Exec::kBlocked;
      if (rs == ff::RingStatus::kCorrupt) {
        *st = IBV_WC_REM_OP_ERR;
        return Exec::kDone;
      }
      auto* h = reinterpret_cast<ff::RecordHeader*>(p);
      std::memset(h, 0, sizeof(*h));
      h->total = total;
      h->kind = ff::kRecWriteImm;
      h->flags = ff::kRecFirst | ff::kRecLast | ff::kRecImm;
      h->msg_len = static_cast<uint32_t>(w.length);
      h->imm = w.imm;
      h->src_qpn = qp->qpx.qp_base.qp_num;
      h->src_ip = htonl(qp->ctx->session->ip);
      link->producer.Commit(total);
      link->dirty = true;
      return Exec::kDone;
    }
    case IBV_WR_RDMA_READ: {
      char* src = nullptr;
      *st = ResolveRemote(qp, link, w.rkey, w.remote_addr, w.length, IBV_ACCESS_REMOTE_READ, &src);
      if (*st == IBV_WC_SUCCESS) CopyToSges(WqeSges(qp, index), w.num_sge, 0, src, w.length);
      return Exec::kDone;
    }
    case IBV_WR_ATOMIC_CMP_AND_SWP:
    case IBV_WR_ATOMIC_FETCH_AND_ADD: {
      if ((w.remote_addr & 7) != 0 || w.length < 8) {
        *st = IBV_WC_REM_INV_REQ_ERR;
        return Exec::kDone;
      }
      char* target = nullptr;
      *st = ResolveRemote(qp, link, w.rkey, w.remote_addr, 8, IBV_ACCESS_REMOTE_ATOMIC, &target);
      if (*st != IBV_WC_SUCCESS) return Exec::kDone;
      const uint64_t old = ff::AtomicOp(reinterpret_cast<uint64_t*>(target), w.opcode,
                                        w.compare_add, w.swap);
      CopyToSges(WqeSges(qp, index), w.num_sge, 0, reinterpret_cast<const char*>(&old), 8);
      return Exec::kDone;
    }
    default:
      *st = IBV_WC_LOC_QP_OP_ERR;
      return Exec::kDone;
  }
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
  PushWc(qp->scq, wc);
}

void PublishLink(PeerLink* link) {
  if (!link->dirty) return;
  link->producer.Publish();
  link->dirty = false;
  ff::WakeIfArmed(link->notify, link->notify_fd.get());
}

void UpdatePending(Qp* qp) {
  const bool has = qp->sq_head != qp->sq_tail;
  if (has == qp->in_pending_list) return;
  auto& v = qp->ctx->pending;
  if (has) {
    v.push_back(qp);
  } else {
    v.erase(std::remove(v.begin(), v.end(), qp), v.end());
  }
  qp->in_pending_list = has;
}

bool Retire(Qp* qp);

void Progress(Qp* qp) {
  if (qp->qpx.qp_base.state == IBV_QPS_ERR) {
    FailQp(qp, IBV_WC_WR_FLUSH_ERR);
    return;
  }
  if (qp->remote_inflight > 0 && qp->link && qp->link->remote) DrainResponses(qp, qp->link.get());
  PeerLink* touched[8];
  int ntouched = 0;
  // Execute what can be executed, in order.
  while (qp->sq_exec != qp->sq_tail) {
    SendWqe& w = qp->sq[qp->sq_exec & qp->sq_mask];
    ibv_wc_status st = IBV_WC_SUCCESS;
    PeerLink* link = nullptr;
    const Exec e = Execute(qp, w, qp->sq_exec, &st, &link);
    if (link != nullptr && link->dirty) {
      bool seen = false;
      for (int i = 0; i < ntouched; ++i) seen |= touched[i] == link;
      if (!seen) {
        if (ntouched == 8) {
          PublishLink(touched[0]);
          touched[0] = link;
        } else {
          touched[ntouched++] = link;
        }
      }
    }
    if (e == Exec::kBlocked) break;
    if (e == Exec::kInFlight) {
      w.in_flight = true;
      ++qp->remote_inflight;
    } else {
      w.done = true;
      w.status = st;
    }
    ++qp->sq_exec;
    if (st != IBV_WC_SUCCESS && qp->type != IBV_QPT_UD) break;  // retired below as an error
  }
  for (int i = 0; i < ntouched; ++i) PublishLink(touched[i]);
  if (Retire(qp)) UpdatePending(qp);
}

// Completes executed work requests in posting order. false when an error moved the QP to
// the error state (everything else was flushed).
bool Retire(Qp* qp) {
  while (qp->sq_head != qp->sq_exec) {
    SendWqe& w = qp->sq[qp->sq_head & qp->sq_mask];
    if (!w.done) break;
    const auto st = static_cast<ibv_wc_status>(w.status);
    if (st != IBV_WC_SUCCESS || w.signaled) CompleteSend(qp, w, st);
    ++qp->sq_head;
    if (st != IBV_WC_SUCCESS && qp->type != IBV_QPT_UD) {
      // A transport error moves the QP to the error state and flushes the rest.
      qp->qpx.qp_base.state = IBV_QPS_ERR;
      qp->attr.qp_state = IBV_QPS_ERR;
      FailQp(qp, IBV_WC_WR_FLUSH_ERR);
      return false;
    }
  }
  return true;
}

RecvQueue* RqOf(Qp* qp) { return qp->srq != nullptr ? &qp->srq->rq : &qp->rq; }

bool PopRecv(Qp* qp, InboundState* in) {
  RecvQueue* rq = RqOf(qp);
  if (rq->head == rq->tail) return false;
  const uint32_t idx = static_cast<uint32_t>(rq->head & rq->mask);
  in->wqe = rq->wqes[idx];
  std::memcpy(in->sges, &rq->sges[static_cast<size_t>(idx) * rq->max_sge],
              sizeof(ibv_sge) * in->wqe.num_sge);
  ++rq->head;
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
  wc.slid = ff::LidForIp(ntohl(h.src_ip));
  if (h.flags & ff::kRecImm) {
    wc.wc_flags |= IBV_WC_WITH_IMM;
    wc.imm_data = h.imm;
  }
  if (qp->type == IBV_QPT_UD) wc.wc_flags |= IBV_WC_GRH;
  PushWc(qp->rcq, wc);
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

// Turns published records of `qp`'s rings into receive completions. Returns false when
// a ring turned out corrupt (the QP was failed).
bool Drain(Qp* qp) {
  const ibv_qp_state state = qp->qpx.qp_base.state;
  if (state == IBV_QPS_RESET || state == IBV_QPS_INIT) return true;  // not receiving yet
  const bool discard = state == IBV_QPS_ERR;
  for (uint32_t r = 0; r < qp->num_rings; ++r) {
    ff::RingConsumer& cons = qp->consumers[r];
    InboundState& in = qp->inbound[r];
    bool consumed = false;
    for (int budget = 0; budget < 4096; ++budget) {
      if (!discard && CqFull(qp->rcq)) break;
      ff::RecordHeader h;
      const char* payload = nullptr;
      const ff::RingStatus rs = cons.Peek(&h, &payload);
      if (rs == ff::RingStatus::kEmpty) break;
      if (rs == ff::RingStatus::kCorrupt) {
        LogError("QP 0x%x: the peer corrupted its ring; moving the QP to the error state",
                 qp->qpx.qp_base.qp_num);
        if (consumed) cons.Release();
        qp->qpx.qp_base.state = IBV_QPS_ERR;
        FailQp(qp, IBV_WC_WR_FLUSH_ERR);
        return false;
      }
      consumed = true;
      cons.Consume(h);
      if (discard) continue;
      if (h.kind == ff::kRecSend) {
        if (h.flags & ff::kRecFirst) {
          ResetInbound(&in);
          const bool qkey_ok = qp->type != IBV_QPT_UD || h.qkey == qp->attr.qkey;
          if (!qkey_ok || !PopRecv(qp, &in)) {
            in.drop = true;  // no receive posted (UC/UD) or wrong Q_Key: drop it
          } else {
            in.active = true;
            in.msg_len = h.msg_len;
            in.offset = qp->type == IBV_QPT_UD ? sizeof(ibv_grh) : 0;
            if (in.offset + h.msg_len > in.wqe.total) {
              in.status = IBV_WC_LOC_LEN_ERR;
            } else if (qp->type == IBV_QPT_UD) {
              WriteGrh(&in, h, qp->ctx->session->ip);
            }
          }
        }
        if (in.active && in.status == IBV_WC_SUCCESS) {
          if (in.offset + h.frag_len > in.wqe.total) {
            in.status = IBV_WC_LOC_LEN_ERR;
          } else {
            CopyToSges(in.sges, in.wqe.num_sge, in.offset, payload, h.frag_len);
            in.offset += h.frag_len;
          }
        }
        if (h.flags & ff::kRecLast) {
          if (in.active) {
            const uint32_t len = in.msg_len + (qp->type == IBV_QPT_UD ? sizeof(ibv_grh) : 0);
            CompleteRecv(qp, in, h, IBV_WC_RECV, len);
            if (in.status != IBV_WC_SUCCESS && qp->type != IBV_QPT_UD) {
              cons.Release();
              qp->qpx.qp_base.state = IBV_QPS_ERR;
              FailQp(qp, IBV_WC_WR_FLUSH_ERR);
              return false;
            }
          }
          ResetInbound(&in);
        }
      } else if (h.kind == ff::kRecWriteImm) {
        InboundState& imm = qp->imm_scratch;
        ResetInbound(&imm);
        if (PopRecv(qp, &imm)) CompleteRecv(qp, imm, h, IBV_WC_RECV_RDMA_WITH_IMM, h.msg_len);
      }
    }
    if (consumed) cons.Release();
  }
  return true;
}

void HandleAttention(Context* ctx) {
  if (!ctx->attention.exchange(false, std::memory_order_acq_rel)) return;
  for (Qp* qp : std::vector<Qp*>(ctx->qps)) {
    if (qp->peer_gone.load(std::memory_order_acquire) == 0) continue;
    const ibv_qp_state state = qp->qpx.qp_base.state;
    if (state == IBV_QPS_RESET || state == IBV_QPS_ERR) continue;
    // Deliver what the peer published before it went, and apply the answers that arrived
    // before the news, then fail the connection.
    Drain(qp);
    if (qp->link && qp->link->remote && qp->remote_inflight > 0) {
      DrainResponses(qp, qp->link.get());
      if (!Retire(qp)) continue;
    }
    if (qp->link) qp->link->dead = true;
    if (qp->peer_gone.load(std::memory_order_acquire) ==
            static_cast<uint32_t>(PeerGone::kDestroyed) &&
        !ctx->session->fatal.load()) {
      // An orderly close, as on a fabric: posted receives stay; sends from now on fail.
      // Requests already on their way to another node are still answered (an error if
      // they arrive after the close).
      continue;
    }
    if (qp->type == IBV_QPT_UD && !ctx->session->fatal.load()) continue;
    qp->qpx.qp_base.state = IBV_QPS_ERR;
    qp->attr.qp_state = IBV_QPS_ERR;
    FailQp(qp, IBV_WC_RETRY_EXC_ERR);
    PushAsyncEvent(ctx, IBV_EVENT_QP_FATAL, &qp->qpx.qp_base);
  }
}

int PostRecvCommon(Context* ctx, Qp* qp, RecvQueue* rq, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  int rc = 0;
  uint64_t added = 0;
  for (; wr != nullptr; wr = wr->next) {
    if (rq->count() >= rq->max_wr) {
      rc = ENOMEM;
      break;
    }
    if (wr->num_sge < 0 || static_cast<uint32_t>(wr->num_sge) > rq->max_sge ||
        !ValidSges(ctx, wr->sg_list, static_cast<uint32_t>(wr->num_sge), IBV_ACCESS_LOCAL_WRITE)) {
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

void WakeCq(Cq* cq) {
  if (cq->notify_slot == ff::proto::kNoId || cq->channel == nullptr) return;
  ff::NotifySlot* slot = cq->ctx->session->notify.as<ff::NotifySlot>() + cq->notify_slot;
  slot->fired.store(1, std::memory_order_release);
  Signal(cq->channel->ch.fd);
}

void FlushRecvs(Qp* qp) {
  if (qp->srq != nullptr) return;  // SRQ receives belong to the SRQ, not the QP
  RecvQueue* rq = &qp->rq;
  while (rq->head != rq->tail) {
    const RecvWqe& wqe = rq->wqes[rq->head & rq->mask];
    ibv_wc wc{};
    wc.wr_id = wqe.wr_id;
    wc.status = IBV_WC_WR_FLUSH_ERR;
    wc.opcode = IBV_WC_RECV;
    wc.qp_num = qp->qpx.qp_base.qp_num;
    PushWc(qp->rcq, wc);
    ++rq->head;
  }
  // Senders must not claim receives that no longer exist.
  rq->posted = rq->credits->claimed.load(std::memory_order_acquire);
  rq->credits->posted.store(rq->posted, std::memory_order_release);
}

void FailQp(Qp* qp, ibv_wc_status first) {
  while (qp->sq_head != qp->sq_tail) {
    CompleteSend(qp, qp->sq[qp->sq_head & qp->sq_mask], first);
    first = IBV_WC_WR_FLUSH_ERR;
    ++qp->sq_head;
  }
  qp->sq_exec = qp->sq_tail;
  qp->remote_inflight = 0;
  qp->remote_reads = 0;
  FlushRecvs(qp);
  UpdatePending(qp);
}

void ResetQueues(Qp* qp) {
  qp->sq_head = qp->sq_tail;
  qp->sq_exec = qp->sq_tail;
  qp->remote_inflight = 0;
  qp->remote_reads = 0;
  if (qp->srq == nullptr) {
    qp->rq.head = qp->rq.tail;
    qp->rq.posted = qp->rq.credits->claimed.load(std::memory_order_acquire);
    qp->rq.credits->posted.store(qp->rq.posted, std::memory_order_release);
  }
  for (uint32_t r = 0; r < qp->num_rings; ++r) {
    qp->inbound[r] = InboundState{};
    ff::RingConsumer& cons = qp->consumers[r];
    ff::RecordHeader h;
    const char* payload;
    for (int i = 0; i < (1 << 16) && cons.Peek(&h, &payload) == ff::RingStatus::kOk; ++i)
      cons.Consume(h);
    cons.Release();
  }
  UpdatePending(qp);
}

void ProgressPending(Context* ctx) {
  if (ctx->pending.empty()) return;
  for (Qp* qp : std::vector<Qp*>(ctx->pending)) Progress(qp);
}

int PostSend(ibv_qp* ibqp, ibv_send_wr* wr, ibv_send_wr** bad) {
  Qp* qp = ToQp(ibqp);
  Context* ctx = qp->ctx;
  std::lock_guard<SpinLock> l(ctx->lock);
  if (ctx->attention.load(std::memory_order_relaxed)) HandleAttention(ctx);
  const ibv_qp_state state = ibqp->state;
  if (state != IBV_QPS_RTS && state != IBV_QPS_ERR) {
    *bad = wr;
    return EINVAL;
  }
  int rc = 0;
  const uint32_t max_sge = qp->cap.max_send_sge;
  for (; wr != nullptr; wr = wr->next) {
    if (qp->sq_tail - qp->sq_head > qp->sq_mask || qp->sq_tail - qp->sq_head >= qp->cap.max_send_wr) {
      rc = ENOMEM;
      break;
    }
    const uint32_t op = wr->opcode;
    bool op_ok;
    switch (qp->type) {
      case IBV_QPT_UD:
        op_ok = op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM;
        break;
      case IBV_QPT_UC:
        op_ok = op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM || op == IBV_WR_RDMA_WRITE ||
                op == IBV_WR_RDMA_WRITE_WITH_IMM;
        break;
      default:
        op_ok = op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM || op == IBV_WR_RDMA_WRITE ||
                op == IBV_WR_RDMA_WRITE_WITH_IMM || op == IBV_WR_RDMA_READ ||
                op == IBV_WR_ATOMIC_CMP_AND_SWP || op == IBV_WR_ATOMIC_FETCH_AND_ADD;
    }
    if (!op_ok || wr->num_sge < 0 || static_cast<uint32_t>(wr->num_sge) > max_sge ||
        (qp->type == IBV_QPT_UD && wr->wr.ud.ah == nullptr)) {
      rc = EINVAL;
      break;
    }
    uint64_t length = 0;
    for (int i = 0; i < wr->num_sge; ++i) length += wr->sg_list[i].length;
    const bool is_inline = (wr->send_flags & IBV_SEND_INLINE) &&
                           (op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM ||
                            op == IBV_WR_RDMA_WRITE || op == IBV_WR_RDMA_WRITE_WITH_IMM);
    if ((is_inline && length > ff::kMaxInline) || length > ff::kMaxMsgSize ||
        (qp->type == IBV_QPT_UD && length > ff::kMtu)) {
      rc = EINVAL;
      break;
    }
    const uint64_t index = qp->sq_tail;
    SendWqe& w = qp->sq[index & qp->sq_mask];
    w = SendWqe{};
    w.wr_id = wr->wr_id;
    w.opcode = op;
    w.flags = wr->send_flags;
    w.signaled = qp->sq_sig_all || (wr->send_flags & IBV_SEND_SIGNALED);
    w.length = length;
    w.imm = wr->imm_data;
    ibv_sge* sges = WqeSges(qp, index);
    if (is_inline) {
      char* buf = &qp->sq_inline[(index & qp->sq_mask) * ff::kMaxInline];
      CopyFromSges(wr->sg_list, static_cast<uint32_t>(wr->num_sge), 0, buf, length);
      sges[0] = ibv_sge{reinterpret_cast<uintptr_t>(buf), static_cast<uint32_t>(length), 0};
      w.num_sge = 1;
    } else {
      std::memcpy(sges, wr->sg_list, sizeof(ibv_sge) * wr->num_sge);
      w.num_sge = static_cast<uint32_t>(wr->num_sge);
      const bool writes_local = op == IBV_WR_RDMA_READ || op == IBV_WR_ATOMIC_CMP_AND_SWP ||
                                op == IBV_WR_ATOMIC_FETCH_AND_ADD;
      if (!ValidSges(ctx, sges, w.num_sge, writes_local ? IBV_ACCESS_LOCAL_WRITE : 0))
        w.pre_status = IBV_WC_LOC_PROT_ERR;
    }
    switch (op) {
      case IBV_WR_RDMA_WRITE:
      case IBV_WR_RDMA_WRITE_WITH_IMM:
      case IBV_WR_RDMA_READ:
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
    if (qp->type == IBV_QPT_UD) {
      const Ah* ah = ToAh(wr->wr.ud.ah);
      w.dest_ip = ah->ip;
      w.dest_lid = ah->lid;
      w.remote_qpn = wr->wr.ud.remote_qpn;
      // A Q_Key with the high bit set means "use the QP's own Q_Key".
      w.remote_qkey = (wr->wr.ud.remote_qkey & 0x80000000u) ? qp->attr.qkey : wr->wr.ud.remote_qkey;
    }
    ++qp->sq_tail;
  }
  if (rc != 0) *bad = wr;
  Progress(qp);
  return rc;
}

int PostRecv(ibv_qp* ibqp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  Qp* qp = ToQp(ibqp);
  Context* ctx = qp->ctx;
  std::lock_guard<SpinLock> l(ctx->lock);
  if (qp->srq != nullptr || ibqp->state == IBV_QPS_RESET) {
    *bad = wr;
    return EINVAL;
  }
  return PostRecvCommon(ctx, qp, &qp->rq, wr, bad);
}

int PostSrqRecv(ibv_srq* ibsrq, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  Srq* srq = ToSrq(ibsrq);
  std::lock_guard<SpinLock> l(srq->ctx->lock);
  return PostRecvCommon(srq->ctx, nullptr, &srq->rq, wr, bad);
}

// Sleeps until the router rings the process wake word (armed by the caller), at most FFV_REMOTE_WAIT_US
// (default 1000; 0: only yield the CPU). Called without the context lock.
void WaitForRouter(Context* ctx) {
  static const int wait_us = [] {
    const char* v = std::getenv("FFV_REMOTE_WAIT_US");
    return v != nullptr ? std::atoi(v) : 1000;
  }();
  Session* s = ctx->session;
  if (wait_us <= 0 || !s->wake_fd) {
    sched_yield();
    return;
  }
  pollfd p{s->wake_fd.get(), POLLIN, 0};
  const timespec ts{0, static_cast<long>(wait_us) * 1000};
  if (::ppoll(&p, 1, &ts, nullptr) > 0) {
    uint64_t v;
    [[maybe_unused]] ssize_t r = ::read(s->wake_fd.get(), &v, sizeof(v));
  }
}

// Advances queued sends and turns published ring records into completions of `cq`.
void Collect(Context* ctx, Cq* cq) {
  if (!ctx->pending.empty()) ProgressPending(ctx);
  for (Qp* qp : cq->recv_qps) Drain(qp);
}

// Moves completions into the caller's array after the `k` already there.
int PopWcs(Cq* cq, int n, ibv_wc* wc, int k) {
  while (k < n && cq->head != cq->tail) {
    wc[k++] = cq->wcs[cq->head & cq->mask];
    ++cq->head;
  }
  return k;
}

// For a context with cross-node links: true when whatever can still complete on `cq` is
// delivered by the router, which rings the process wake word, so an empty poll may sleep
// instead of spinning. Same-node peers and UD receives (any sender may deliver) do not ring
// it, and queued local sends need polling.
bool RouterFeedsOnly(Context* ctx, Cq* cq) {
  auto remote = [](const Qp* qp) {
    return qp->type != IBV_QPT_UD && qp->link != nullptr && qp->link->remote;
  };
  for (const Qp* qp : cq->recv_qps)
    if (!remote(qp)) return false;
  for (const Qp* qp : ctx->pending)
    if (!remote(qp)) return false;
  return true;
}

int PollCq(ibv_cq* ibcq, int n, ibv_wc* wc) {
  Cq* cq = ToCq(ibcq);
  Context* ctx = cq->ctx;
  if (n <= 0) return 0;
  std::lock_guard<SpinLock> l(ctx->lock);
  if (ctx->attention.load(std::memory_order_relaxed)) HandleAttention(ctx);
  if (!ctx->pending.empty()) ProgressPending(ctx);
  if (cq->tail - cq->head < static_cast<uint64_t>(n)) {
    for (Qp* qp : cq->recv_qps) Drain(qp);
  }
  int k = PopWcs(cq, n, wc, 0);
  if (__builtin_expect(k == 0 && ctx->remote_links != 0, 0) && RouterFeedsOnly(ctx, cq)) {
    // Cross-node traffic is carried by the routers, which need the CPU this loop would
    // spin on: wait (bounded) until the router delivers something to this process.
    ff::NotifySlot* wake = ctx->session->notify.as<ff::NotifySlot>() + ff::proto::kWakeSlot;
    wake->armed.exchange(1, std::memory_order_seq_cst);  // then look once more: no lost wake
    Collect(ctx, cq);
    if (cq->head == cq->tail) {
      ctx->lock.unlock();
      WaitForRouter(ctx);
      ctx->lock.lock();
      Collect(ctx, cq);
    }
    wake->armed.store(0, std::memory_order_relaxed);
    k = PopWcs(cq, n, wc, k);
  }
  return k;
}

int ReqNotifyCq(ibv_cq* ibcq, int) {
  Cq* cq = ToCq(ibcq);
  if (cq->notify_slot == ff::proto::kNoId) return 0;
  ff::NotifySlot* slot = cq->ctx->session->notify.as<ff::NotifySlot>() + cq->notify_slot;
  slot->armed.exchange(1, std::memory_order_seq_cst);  // full barrier before later polls
  return 0;
}

}  // namespace ffv

using namespace ffv;

extern "C" FFV_EXPORT int ibv_get_cq_event(ibv_comp_channel* channel, ibv_cq** cq_out,
                                           void** cq_context) {
  if (channel == nullptr || cq_out == nullptr) {
    errno = EINVAL;
    return -1;
  }
  Channel* ch = ToChannel(channel);
  Context* ctx = ch->ctx;
  for (;;) {
    Cq* found = nullptr;
    bool pending;
    {
      std::lock_guard<SpinLock> l(ctx->lock);
      for (Cq* cq : ch->cqs) {
        ff::NotifySlot* slot = ctx->session->notify.as<ff::NotifySlot>() + cq->notify_slot;
        if (slot->fired.load(std::memory_order_acquire) && slot->fired.exchange(0)) {
          found = cq;
          break;
        }
      }
      // Sends waiting for ring space or a receive are advanced while we sleep.
      if (ctx->attention.load(std::memory_order_relaxed)) HandleAttention(ctx);
      ProgressPending(ctx);
      pending = !ctx->pending.empty();
    }
    if (found != nullptr) {
      *cq_out = &found->cq;
      if (cq_context != nullptr) *cq_context = found->cq.cq_context;
      return 0;
    }
    pollfd p{channel->fd, POLLIN, 0};
    const bool nonblocking = (::fcntl(channel->fd, F_GETFL) & O_NONBLOCK) != 0;
    const int r = ::poll(&p, 1, nonblocking ? 0 : (pending ? 1 : -1));
    if (r < 0 && errno != EINTR) return -1;
    if (r > 0) {
      uint64_t v;
      if (::read(channel->fd, &v, sizeof(v)) < 0 && errno != EAGAIN) return -1;
      continue;
    }
    if (nonblocking) {
      errno = EAGAIN;
      return -1;
    }
  }
}
