// Memory windows. A window is an entry of the context's MR table that the router writes
// (router/src/objects/memory_windows.h): unbound it grants nothing; a bind points it at part of a
// registration with a new key, and peers check accesses through it exactly as through a
// registration (ff::CheckRemoteAccess), on this node and in the router for other nodes.
// Binds and invalidations are work requests executed in order with the rest of the send
// queue: ibv_bind_mw (type 1) and IBV_WR_BIND_MW (type 2) ask the router to rewrite the
// entry; a refusal completes with IBV_WC_MW_BIND_ERR and moves the QP to ERR, as an HCA.
#include <mutex>

#include "base/exports.h"
#include "datapath/send_queue.h"
#include "session/session.h"

namespace ff::verbs {
namespace {

constexpr unsigned kWindowRights =
    IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;

Mw* FindMw(Context* ctx, uint32_t key) {
  auto it = ctx->mws.find(ff::MrSlotOfKey(key));
  return it != ctx->mws.end() && it->second->key == key ? it->second : nullptr;
}

// Records that `mw` is now bound to `mr` (nullptr: unbound). ctx->lock held.
void Rebind(Mw* mw, Mr* mr) {
  if (mw->bound != nullptr) --mw->bound->windows;
  mw->bound = mr;
  if (mr != nullptr) ++mr->windows;
}

ibv_wc_status Bind(Qp* qp, const SendWqe& w) {
  Mw* mw = ToMw(w.mw);
  Mr* mr = w.bind_mr != nullptr ? ToMr(w.bind_mr) : nullptr;
  ibv_pd* pd = qp->qpx.qp_base.pd;
  const uint64_t length = w.compare_add;
  // The window, its registration and the QP share one protection domain.
  if (mw->mw.pd != pd || (length > 0 && (mr == nullptr || mr->mr.pd != pd))) {
    LogDebug("memory window bind: the window, registration and QP are of different PDs");
    return IBV_WC_MW_BIND_ERR;
  }
  ff::proto::BindMw m{};
  m.key = mw->key;
  m.new_key = w.rkey;
  m.mr_key = mr != nullptr ? mr->mr.lkey : 0;
  m.addr = w.remote_addr;
  m.length = length;
  m.access = w.imm & ~static_cast<unsigned>(IBV_ACCESS_LOCAL_WRITE);
  m.qpn = mw->mw.type == IBV_MW_TYPE_2 ? qp->qpx.qp_base.qp_num : 0;
  if ((m.access & ~kWindowRights) != 0) return IBV_WC_MW_BIND_ERR;
  if (const int rc = qp->ctx->session->SimpleCall(&m, sizeof(m))) {
    LogDebug("memory window bind refused by the router: %s", std::strerror(rc));
    return IBV_WC_MW_BIND_ERR;
  }
  qp->ctx->mws.erase(ff::MrSlotOfKey(mw->key));
  mw->key = w.rkey;
  mw->mw.rkey = w.rkey;
  qp->ctx->mws[ff::MrSlotOfKey(mw->key)] = mw;
  Rebind(mw, length > 0 ? mr : nullptr);
  return IBV_WC_SUCCESS;
}

}  // namespace

// Unbinds type 2 window `key` of `ctx`; `qpn` != 0: a SEND_WITH_INV received on that QP.
// 0 or the router's errno. ctx->lock held.
int InvalidateMw(Context* ctx, uint32_t key, uint32_t qpn) {
  Mw* mw = FindMw(ctx, key);
  if (mw == nullptr || mw->mw.type != IBV_MW_TYPE_2) return EINVAL;
  ff::proto::InvalidateMw m{};
  m.key = key;
  m.qpn = qpn;
  if (const int rc = ctx->session->SimpleCall(&m, sizeof(m))) return rc;
  Rebind(mw, nullptr);
  return 0;
}

ibv_wc_status ExecuteWindowOp(Qp* qp, const SendWqe& w) {
  if (w.opcode == IBV_WR_BIND_MW) return Bind(qp, w);
  // LOCAL_INV: of a type 2 window of this context (registrations are not invalidated).
  if (const int rc = InvalidateMw(qp->ctx, w.rkey, 0)) {
    LogDebug("local invalidation of key 0x%x refused: %s", w.rkey, std::strerror(rc));
    return IBV_WC_LOC_QP_OP_ERR;
  }
  return IBV_WC_SUCCESS;
}

ibv_mw* AllocMw(ibv_pd* pd, ibv_mw_type type) {
  int rc = type == IBV_MW_TYPE_1 || type == IBV_MW_TYPE_2 ? 0 : EINVAL;
  Mw* out = nullptr;
  if (rc == 0) {
    rc = Guarded([&] {
      Context* ctx = ToCtx(pd->context);
      auto mw = std::make_unique<Mw>();
      ff::proto::AllocMw m{};
      m.type = type;
      m.pd = PdId(pd);
      ff::proto::Response r{};
      if (const int err = ctx->session->Call(&m, sizeof(m), nullptr, 0, &r)) return err;
      mw->key = r.u.reg_mr.key;
      mw->mw.context = pd->context;
      mw->mw.pd = pd;
      mw->mw.rkey = mw->key;
      mw->mw.handle = mw->key;
      mw->mw.type = type;
      std::lock_guard<AdaptiveLock> l(ctx->lock);
      ctx->mws[ff::MrSlotOfKey(mw->key)] = mw.get();
      out = mw.release();
      return 0;
    });
  }
  return ObjectOrNull(rc, rc == 0 ? &out->mw : nullptr);
}

int BindMw(ibv_qp* qp, ibv_mw* mw, ibv_mw_bind* bind) {
  const ibv_mw_bind_info& info = bind->bind_info;
  if (info.length > 0 && info.mr == nullptr) return EINVAL;
  if (info.mr != nullptr && info.mr->pd != mw->pd) return EPERM;
  if (qp->pd != mw->pd) return EPERM;
  // The new key differs from the old in its low 8 bits (ibv_inc_rkey), as on mlx5; the
  // application reads it from mw->rkey as soon as the bind is posted.
  const uint32_t new_key = ibv_inc_rkey(mw->rkey);
  ibv_send_wr wr{};
  wr.wr_id = bind->wr_id;
  wr.opcode = IBV_WR_BIND_MW;
  wr.send_flags = bind->send_flags;
  wr.bind_mw.mw = mw;
  wr.bind_mw.rkey = new_key;
  wr.bind_mw.bind_info = info;
  const int rc = PostBindType1(qp, &wr);
  if (rc == 0) mw->rkey = new_key;
  return rc;
}

int DeallocMw(ibv_mw* ibmw) {
  Mw* mw = ToMw(ibmw);
  Context* ctx = ToCtx(ibmw->context);
  return Guarded([&] {
    {
      std::lock_guard<AdaptiveLock> l(ctx->lock);
      ctx->mws.erase(ff::MrSlotOfKey(mw->key));
      Rebind(mw, nullptr);
    }
    ff::proto::DeallocMw m{};
    m.key = mw->key;
    const int rc = ctx->session->SimpleCall(&m, sizeof(m));
    if (rc != 0 && rc != ENOTCONN)
      LogError("router refused to free a memory window: %s", std::strerror(rc));
    delete mw;
    return 0;
  });
}

}  // namespace ff::verbs
