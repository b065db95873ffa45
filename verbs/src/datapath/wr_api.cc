// The ibv_wr_* post-send API (ibv_qp_to_qp_ex): work requests are collected between
// wr_start and wr_complete and then posted through the same path as ibv_post_send. These
// functions return nothing, so a failure (only allocation can fail) is kept in
// WrBatch::error and reported by wr_complete.
#include <cstring>
#include <mutex>

#include "base/exports.h"
#include "datapath/send_queue.h"

namespace ff::verbs {
namespace {

constexpr size_t kNoInline = ~size_t{0};

WrBatch& BatchOf(ibv_qp_ex* q) { return reinterpret_cast<Qp*>(q)->batch; }

// Runs `change` on the batch; remembers ENOMEM instead of letting it escape into C code.
template <typename F>
void Batch(ibv_qp_ex* q, F&& change) {
  WrBatch& b = BatchOf(q);
  if (const int rc = Guarded([&] { return change(b), 0; })) b.error = rc;
}

ibv_send_wr* Last(ibv_qp_ex* q) {
  WrBatch& b = BatchOf(q);
  if (b.wrs.empty()) {
    b.error = EINVAL;
    return nullptr;
  }
  return &b.wrs.back();
}

// Starts a work request of `op`; `fill` completes it.
template <typename F>
void NewWr(ibv_qp_ex* q, ibv_wr_opcode op, F&& fill) {
  Batch(q, [&](WrBatch& b) {
    b.wrs.push_back(ibv_send_wr{});
    b.sge_begin.push_back(b.sges.size());
    b.inline_begin.push_back(kNoInline);
    ibv_send_wr& wr = b.wrs.back();
    wr.wr_id = q->wr_id;
    wr.send_flags = q->wr_flags;
    wr.opcode = op;
    fill(&wr);
  });
}

void Start(ibv_qp_ex* q) { BatchOf(q).Clear(); }

// Points every WR at its SGEs and inline bytes (the vectors no longer move) and chains them.
void Link(WrBatch& b) {
  for (size_t i = 0; i < b.wrs.size(); ++i) {
    ibv_send_wr& wr = b.wrs[i];
    if (b.inline_begin[i] == kNoInline) continue;
    const size_t begin = b.inline_begin[i];
    size_t end = b.inline_data.size();
    for (size_t j = i + 1; j < b.wrs.size(); ++j) {
      if (b.inline_begin[j] != kNoInline) {
        end = b.inline_begin[j];
        break;
      }
    }
    b.sges.push_back(ibv_sge{reinterpret_cast<uintptr_t>(b.inline_data.data() + begin),
                             static_cast<uint32_t>(end - begin), 0});
    b.sge_begin[i] = b.sges.size() - 1;
    wr.num_sge = 1;
    wr.send_flags |= IBV_SEND_INLINE;
  }
  for (size_t i = 0; i < b.wrs.size(); ++i) {
    ibv_send_wr& wr = b.wrs[i];
    wr.sg_list = wr.num_sge > 0 ? &b.sges[b.sge_begin[i]] : nullptr;
    wr.next = i + 1 < b.wrs.size() ? &b.wrs[i + 1] : nullptr;
  }
}

int Complete(ibv_qp_ex* q) {
  WrBatch& b = BatchOf(q);
  static std::once_flag traced;
  std::call_once(traced, [] { LogDebug("work requests arrive through the ibv_wr_* API"); });
  int rc = b.error;
  if (rc == 0 && !b.wrs.empty()) rc = Guarded([&] { return Link(b), 0; });
  if (rc == 0 && !b.wrs.empty()) {
    ibv_send_wr* bad = nullptr;
    rc = PostSend(&q->qp_base, b.wrs.data(), &bad);
  }
  b.Clear();
  return rc;
}

void Abort(ibv_qp_ex* q) { Start(q); }

void Send(ibv_qp_ex* q) {
  NewWr(q, IBV_WR_SEND, [](ibv_send_wr*) {});
}
void SendImm(ibv_qp_ex* q, __be32 imm) {
  NewWr(q, IBV_WR_SEND_WITH_IMM, [&](ibv_send_wr* wr) { wr->imm_data = imm; });
}
void Write(ibv_qp_ex* q, uint32_t rkey, uint64_t addr) {
  NewWr(q, IBV_WR_RDMA_WRITE, [&](ibv_send_wr* wr) { wr->wr.rdma = {addr, rkey}; });
}
void WriteImm(ibv_qp_ex* q, uint32_t rkey, uint64_t addr, __be32 imm) {
  NewWr(q, IBV_WR_RDMA_WRITE_WITH_IMM, [&](ibv_send_wr* wr) {
    wr->wr.rdma = {addr, rkey};
    wr->imm_data = imm;
  });
}
void Read(ibv_qp_ex* q, uint32_t rkey, uint64_t addr) {
  NewWr(q, IBV_WR_RDMA_READ, [&](ibv_send_wr* wr) { wr->wr.rdma = {addr, rkey}; });
}
void CmpSwp(ibv_qp_ex* q, uint32_t rkey, uint64_t addr, uint64_t compare, uint64_t swap) {
  NewWr(q, IBV_WR_ATOMIC_CMP_AND_SWP, [&](ibv_send_wr* wr) {
    wr->wr.atomic = {addr, compare, swap, rkey};
  });
}
void FetchAdd(ibv_qp_ex* q, uint32_t rkey, uint64_t addr, uint64_t add) {
  NewWr(q, IBV_WR_ATOMIC_FETCH_AND_ADD, [&](ibv_send_wr* wr) {
    wr->wr.atomic = {addr, add, 0, rkey};
  });
}
void Unsupported(ibv_qp_ex* q) { BatchOf(q).error = EOPNOTSUPP; }
void BindMw(ibv_qp_ex* q, ibv_mw* mw, uint32_t rkey, const ibv_mw_bind_info* info) {
  NewWr(q, IBV_WR_BIND_MW, [&](ibv_send_wr* wr) {
    wr->bind_mw.mw = mw;
    wr->bind_mw.rkey = rkey;
    wr->bind_mw.bind_info = *info;
  });
}
void LocalInv(ibv_qp_ex* q, uint32_t rkey) {
  NewWr(q, IBV_WR_LOCAL_INV, [&](ibv_send_wr* wr) { wr->invalidate_rkey = rkey; });
}
void SendInv(ibv_qp_ex* q, uint32_t rkey) {
  NewWr(q, IBV_WR_SEND_WITH_INV, [&](ibv_send_wr* wr) { wr->invalidate_rkey = rkey; });
}
void SendTso(ibv_qp_ex* q, void*, uint16_t, uint16_t) { Unsupported(q); }
void SetXrc(ibv_qp_ex* q, uint32_t) { Unsupported(q); }

void SetUdAddr(ibv_qp_ex* q, ibv_ah* ah, uint32_t qpn, uint32_t qkey) {
  if (ibv_send_wr* wr = Last(q)) wr->wr.ud = {ah, qpn, qkey};
}
void SetSgeList(ibv_qp_ex* q, size_t n, const ibv_sge* list) {
  if (ibv_send_wr* wr = Last(q)) {
    Batch(q, [&](WrBatch& b) { b.sges.insert(b.sges.end(), list, list + n); });
    wr->num_sge = static_cast<int>(n);
  }
}
void SetSge(ibv_qp_ex* q, uint32_t lkey, uint64_t addr, uint32_t length) {
  const ibv_sge sge{addr, length, lkey};
  SetSgeList(q, 1, &sge);
}
void SetInlineList(ibv_qp_ex* q, size_t n, const ibv_data_buf* bufs) {
  if (Last(q) == nullptr) return;
  Batch(q, [&](WrBatch& b) {
    b.inline_begin.back() = b.inline_data.size();
    for (size_t i = 0; i < n; ++i) {
      const char* p = static_cast<const char*>(bufs[i].addr);
      b.inline_data.insert(b.inline_data.end(), p, p + bufs[i].length);
    }
  });
}
void SetInline(ibv_qp_ex* q, void* addr, size_t length) {
  const ibv_data_buf buf{addr, length};
  SetInlineList(q, 1, &buf);
}

// The 8 bytes are copied now (inline data of the work request), as a provider copies them.
void AtomicWrite(ibv_qp_ex* q, uint32_t rkey, uint64_t addr, const void* atomic_wr) {
  NewWr(q, IBV_WR_ATOMIC_WRITE, [&](ibv_send_wr* wr) { wr->wr.rdma = {addr, rkey}; });
  const ibv_data_buf buf{const_cast<void*>(atomic_wr), 8};
  SetInlineList(q, 1, &buf);
}

}  // namespace

void InitQpEx(Qp* qp) {
  ibv_qp_ex& x = qp->qpx;
  x.comp_mask = 0;
  x.wr_atomic_cmp_swp = CmpSwp;
  x.wr_atomic_fetch_add = FetchAdd;
  x.wr_bind_mw = BindMw;
  x.wr_local_inv = LocalInv;
  x.wr_rdma_read = Read;
  x.wr_rdma_write = Write;
  x.wr_rdma_write_imm = WriteImm;
  x.wr_send = Send;
  x.wr_send_imm = SendImm;
  x.wr_send_inv = SendInv;
  x.wr_send_tso = SendTso;
  x.wr_set_ud_addr = SetUdAddr;
  x.wr_set_xrc_srqn = SetXrc;
  x.wr_set_inline_data = SetInline;
  x.wr_set_inline_data_list = SetInlineList;
  x.wr_set_sge = SetSge;
  x.wr_set_sge_list = SetSgeList;
  x.wr_start = Start;
  x.wr_complete = Complete;
  x.wr_abort = Abort;
  x.wr_atomic_write = AtomicWrite;
}

}  // namespace ff::verbs

extern "C" FFV_EXPORT ibv_qp_ex* ibv_qp_to_qp_ex(ibv_qp* qp) {
  return qp != nullptr ? &ff::verbs::ToQp(qp)->qpx : nullptr;
}
