// The small objects: protection domains, completion channels, completion queues, shared
// receive queues and address handles. Each that the router must know about (channels, CQs,
// SRQs) is announced to it after it exists here and withdrawn before it is freed.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "base/exports.h"
#include "datapath/completion.h"
#include "datapath/recv_path.h"
#include "freeflow/ipv4.h"
#include "session/session.h"

namespace ff::verbs {
namespace {

uint32_t AllocNotifySlot(Session* s) {
  std::lock_guard<std::mutex> g(s->slot_mu);
  if (!s->free_slots.empty()) {
    const uint32_t slot = s->free_slots.back();
    s->free_slots.pop_back();
    return slot;
  }
  return s->next_slot < ff::proto::kWakeSlot ? s->next_slot++ : ff::proto::kNoId;
}

void FreeNotifySlot(Session* s, uint32_t slot) {
  if (slot == ff::proto::kNoId) return;
  std::lock_guard<std::mutex> g(s->slot_mu);
  s->free_slots.push_back(slot);
}

// A fresh id (never 0 or kNoId, which the protocol reserves) from the session's counter.
uint32_t NextId(Context* ctx) {
  for (;;) {
    const uint32_t id = ctx->session->next_id.fetch_add(1, std::memory_order_relaxed);
    if (id != 0 && id != ff::proto::kNoId) return id;
  }
}

template <typename T>
void Erase(std::vector<T*>& v, T* x) {
  v.erase(std::remove(v.begin(), v.end(), x), v.end());
}

// Tells the router that object `id` is gone (answer ignored: it is gone here either way).
template <typename M>
void Withdraw(Session* s, uint32_t M::*id_field, uint32_t id) {
  M m{};
  m.*id_field = id;
  s->SimpleCall(&m, sizeof(m));
}

// Takes `obj` off its context's lists (unlink(ctx), under the lock, returns EBUSY while it is
// still in use), then tells the router it is gone.
template <typename T, typename M, typename Unlink>
int Retract(T* obj, uint32_t M::*id_field, Unlink&& unlink) {
  Context* ctx = obj->ctx;
  {
    std::lock_guard<AdaptiveLock> l(ctx->lock);
    if (const int rc = unlink(ctx)) return rc;
  }
  Withdraw(ctx->session, id_field, obj->id);
  return 0;
}

bool UsedByQp(Context* ctx, const void* obj) {
  for (const Qp* qp : ctx->qps)
    if (qp->scq == obj || qp->rcq == obj || qp->srq == obj) return true;
  return false;
}

// True while a QP, SRQ, MR, memory window or address handle still uses `pd`.
bool PdInUse(ibv_pd* pd) {
  if (reinterpret_cast<const Pd*>(pd)->ahs.load(std::memory_order_acquire) != 0) return true;
  Context* ctx = ToCtx(pd->context);
  std::lock_guard<AdaptiveLock> l(ctx->lock);
  for (const auto& [slot, mw] : ctx->mws)
    if (mw->mw.pd == pd) return true;
  for (const Qp* qp : ctx->qps)
    if (qp->qpx.qp_base.pd == pd) return true;
  for (const Srq* srq : ctx->srqs)
    if (srq->srq.pd == pd) return true;
  for (const Mr* mr : ctx->mrs_by_slot)
    if (mr != nullptr && mr->mr.pd == pd) return true;
  return false;
}

int CreateChannel(Context* ctx, Channel** out) {
  auto ch = std::make_unique<Channel>();
  ch->ctx = ctx;
  ch->ch.context = &ctx->vctx.context;
  // A wake socket, not an eventfd: the router and peers that wake us hold only the
  // sending end, so nothing they do to it changes how the application's fd behaves.
  UniqueFd rx;
  if (const int rc = ff::CreateWakePair(&rx, &ch->tx, false)) return rc;
  ch->id = NextId(ctx);
  ff::proto::CreateChannel m{};
  m.id = ch->id;
  ff::proto::Response r{};
  const int tx = ch->tx.get();
  if (const int rc = ctx->session->Call(&m, sizeof(m), &tx, 1, &r)) return rc;
  ch->ch.fd = rx.release();
  std::lock_guard<AdaptiveLock> l(ctx->lock);
  ctx->channels.push_back(ch.get());
  *out = ch.release();
  return 0;
}

// Gives `cq` its event word when it has a channel. The word starts quiet.
int TakeEventSlot(Session* s, Cq* cq, ibv_comp_channel* channel) {
  if (channel == nullptr) return 0;
  cq->channel = ToChannel(channel);
  cq->notify_slot = AllocNotifySlot(s);
  if (cq->notify_slot == ff::proto::kNoId) return ENOSPC;
  s->slot(cq->notify_slot)->armed.store(0);
  s->slot(cq->notify_slot)->fired.store(0);
  return 0;
}

int CreateCq(Context* ctx, int cqe, void* cq_context, ibv_comp_channel* channel, Cq** out) {
  auto cq = std::make_unique<Cq>();
  cq->ctx = ctx;
  cq->capacity = static_cast<uint32_t>(cqe);
  const uint32_t size = RoundPow2(static_cast<uint32_t>(cqe) + 1);
  cq->wcs.resize(size);
  cq->mask = size - 1;
  if (const int rc = TakeEventSlot(ctx->session, cq.get(), channel)) return rc;
  cq->id = NextId(ctx);
  ff::proto::CreateCq m{};
  m.cq_id = cq->id;
  m.notify_slot = cq->notify_slot;
  m.chan_id = cq->channel != nullptr ? cq->channel->id : ff::proto::kNoId;
  if (const int rc = ctx->session->SimpleCall(&m, sizeof(m))) {
    FreeNotifySlot(ctx->session, cq->notify_slot);
    return rc;
  }
  ibv_cq& c = cq->cq;
  c.context = &ctx->vctx.context;
  c.channel = channel;
  c.cq_context = cq_context;
  c.handle = cq->id;
  c.cqe = cqe;
  pthread_mutex_init(&c.mutex, nullptr);
  pthread_cond_init(&c.cond, nullptr);
  std::lock_guard<AdaptiveLock> l(ctx->lock);
  ctx->cqs.push_back(cq.get());
  if (cq->channel != nullptr) cq->channel->cqs.push_back(cq.get());
  *out = cq.release();
  return 0;
}

// What ibv_create_cq and ibv_create_cq_ex refuse with EINVAL, as the kernel and mlx5 do.
int CheckCqArgs(ibv_context* context, int cqe, ibv_comp_channel* channel, uint32_t comp_vector) {
  if (context == nullptr || cqe < 1 || static_cast<uint32_t>(cqe) > ff::kMaxCqe) return EINVAL;
  if (comp_vector >= static_cast<uint32_t>(context->num_comp_vectors)) return EINVAL;
  if (channel != nullptr && channel->context != context) return EINVAL;
  return 0;
}

// ibv_create_cq_ex's checks (mlx5's answers): unknown comp_mask bits or creation flags are
// EINVAL; a work-completion field the device cannot report is EOPNOTSUPP. No parent domains
// (IBV_CQ_INIT_ATTR_MASK_PD) and no timestamps: see docs/verbs-library.md.
int CheckCqExArgs(ibv_context* context, const ibv_cq_init_attr_ex* a) {
  if (a == nullptr) return EINVAL;
  if (a->comp_mask & ~static_cast<uint32_t>(IBV_CQ_INIT_ATTR_MASK_FLAGS)) {
    LogError("ibv_create_cq_ex: comp_mask 0x%x not supported", a->comp_mask);
    return EINVAL;
  }
  if ((a->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) &&
      (a->flags & ~static_cast<uint32_t>(IBV_CREATE_CQ_ATTR_SINGLE_THREADED |
                                         IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN))) {
    LogError("ibv_create_cq_ex: creation flags 0x%x not supported", a->flags);
    return EINVAL;
  }
  if (a->wc_flags & ~kCqExWcFlags) {
    LogError("ibv_create_cq_ex: wc_flags 0x%llx not supported (supported: 0x%llx)",
             static_cast<unsigned long long>(a->wc_flags & ~kCqExWcFlags),
             static_cast<unsigned long long>(kCqExWcFlags));
    return EOPNOTSUPP;
  }
  return CheckCqArgs(context, static_cast<int>(a->cqe > INT32_MAX ? 0 : a->cqe), a->channel,
                     a->comp_vector);
}

int ResizeCq(Cq* cq, int cqe) {
  std::lock_guard<AdaptiveLock> l(cq->ctx->lock);
  if (static_cast<uint64_t>(cqe) < cq->tail - cq->head) return EINVAL;
  const uint32_t size = RoundPow2(static_cast<uint32_t>(cqe) + 1);
  std::vector<ibv_wc> wcs(size);
  uint64_t n = 0;
  for (uint64_t i = cq->head; i != cq->tail; ++i) wcs[n++] = cq->wcs[i & cq->mask];
  cq->wcs = std::move(wcs);
  cq->mask = size - 1;
  cq->head = 0;
  cq->tail = n;
  cq->capacity = static_cast<uint32_t>(cqe);
  cq->cq.cqe = cqe;
  return 0;
}

int DestroyCq(Cq* cq) {
  const int rc = Retract(cq, &ff::proto::DestroyCq::id, [cq](Context* ctx) {
    if (UsedByQp(ctx, cq)) return EBUSY;
    Erase(ctx->cqs, cq);
    if (cq->channel != nullptr) Erase(cq->channel->cqs, cq);
    return 0;
  });
  if (rc != 0) return rc;
  DropAsyncEvents(cq->ctx, &cq->cq);
  FreeNotifySlot(cq->ctx->session, cq->notify_slot);
  pthread_mutex_destroy(&cq->cq.mutex);
  pthread_cond_destroy(&cq->cq.cond);
  delete cq;
  return 0;
}

int CreateSrq(Context* ctx, ibv_pd* pd, ibv_srq_init_attr* attr, Srq** out) {
  auto srq = std::make_unique<Srq>();
  srq->ctx = ctx;
  int rc = ff::CreateSegment("ffverbs-srq", sizeof(ff::SrqSegment), &srq->seg_fd);
  if (rc == 0) rc = ff::MapSegment(srq->seg_fd.get(), sizeof(ff::SrqSegment), true, &srq->seg);
  if (rc != 0) return rc;
  auto* seg = new (srq->seg.get()) ff::SrqSegment();
  InitRecvQueue(&srq->rq, attr->attr.max_wr, attr->attr.max_sge, &seg->credits);
  srq->limit = attr->attr.srq_limit;
  srq->id = NextId(ctx);
  ff::proto::CreateSrq m{};
  m.id = srq->id;
  ff::proto::Response r{};
  const int fd = srq->seg_fd.get();
  if ((rc = ctx->session->Call(&m, sizeof(m), &fd, 1, &r)) != 0) return rc;
  attr->attr.max_sge = srq->rq.max_sge;
  srq->srq.context = pd->context;
  srq->srq.srq_context = attr->srq_context;
  srq->srq.pd = pd;
  srq->srq.handle = srq->id;
  pthread_mutex_init(&srq->srq.mutex, nullptr);
  pthread_cond_init(&srq->srq.cond, nullptr);
  std::lock_guard<AdaptiveLock> l(ctx->lock);
  ctx->srqs.push_back(srq.get());
  *out = srq.release();
  return 0;
}

int ModifySrq(Srq* srq, const ibv_srq_attr* attr, int mask) {
  std::lock_guard<AdaptiveLock> l(srq->ctx->lock);
  if (mask & IBV_SRQ_MAX_WR) {
    if (attr->max_wr > srq->rq.mask + 1 || attr->max_wr < srq->rq.count()) return EINVAL;
    srq->rq.max_wr = attr->max_wr;
  }
  if (mask & IBV_SRQ_LIMIT) {
    if (attr->srq_limit > srq->rq.max_wr) return EINVAL;
    srq->limit = attr->srq_limit;
  }
  return 0;
}

int DestroySrq(Srq* srq) {
  const int rc = Retract(srq, &ff::proto::DestroySrq::id, [srq](Context* ctx) {
    if (UsedByQp(ctx, srq)) return EBUSY;
    Erase(ctx->srqs, srq);
    if (ctx->warm_rq == &srq->rq) ctx->warm_rq = nullptr;
    return 0;
  });
  if (rc != 0) return rc;
  DropAsyncEvents(srq->ctx, &srq->srq);
  pthread_mutex_destroy(&srq->srq.mutex);
  pthread_cond_destroy(&srq->srq.cond);
  delete srq;
  return 0;
}

int DestroyChannel(Channel* ch) {
  const int rc = Retract(ch, &ff::proto::DestroyChannel::id, [ch](Context* ctx) {
    if (!ch->cqs.empty()) return EBUSY;
    Erase(ctx->channels, ch);
    return 0;
  });
  if (rc != 0) return rc;
  ::close(ch->ch.fd);
  delete ch;
  return 0;
}

int CreateAh(ibv_pd* pd, const ibv_ah_attr* attr, Ah** out) {
  auto ah = std::make_unique<Ah>();
  if (attr->is_global) {
    auto ip = ff::IpFromPodGid(attr->grh.dgid.raw, ToCtx(pd->context)->session->overlay);
    if (!ip) {
      LogError("address handles need a GID of a pod's virtual port (index 0 or 1)");
      return EINVAL;
    }
    ah->ip = *ip;
  } else {
    ah->lid = attr->dlid;
    if (ah->lid == 0) return EINVAL;
  }
  if (attr->port_num != 1 || (attr->is_global && attr->grh.sgid_index >= 2)) return EINVAL;
  ah->ah.context = pd->context;
  ah->ah.pd = pd;
  *out = ah.release();
  return 0;
}

}  // namespace

// XRC is left out (docs/verbs-library.md says why): its entry points refuse clearly.
ibv_xrcd* OpenXrcd(ibv_context*, ibv_xrcd_init_attr*) {
  LogError("ibv_open_xrcd: XRC is not supported by this device");
  return ObjectOrNull<ibv_xrcd>(EOPNOTSUPP, nullptr);
}

int CloseXrcd(ibv_xrcd*) { return EOPNOTSUPP; }

// Only what ibv_create_srq does (libibverbs' inline wrapper sends plain requests there
// already); XRC and tag-matching SRQs are refused.
ibv_srq* CreateSrqEx(ibv_context* context, ibv_srq_init_attr_ex* attr) {
  if (context == nullptr || attr == nullptr) return ObjectOrNull<ibv_srq>(EINVAL, nullptr);
  const bool typed = attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE;
  if (typed && attr->srq_type != IBV_SRQT_BASIC) {
    LogError("ibv_create_srq_ex: SRQ type %d is not supported (%s)", attr->srq_type,
             attr->srq_type == IBV_SRQT_XRC ? "no XRC" : "no tag matching");
    return ObjectOrNull<ibv_srq>(EOPNOTSUPP, nullptr);
  }
  if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_PD) || attr->pd == nullptr)
    return ObjectOrNull<ibv_srq>(EINVAL, nullptr);
  return ibv_create_srq(attr->pd, reinterpret_cast<ibv_srq_init_attr*>(attr));
}

ibv_cq_ex* CreateCqEx(ibv_context* context, ibv_cq_init_attr_ex* attr) {
  Cq* cq = nullptr;
  int rc = CheckCqExArgs(context, attr);
  if (rc == 0) {
    rc = Guarded([&] {
      return CreateCq(ToCtx(context), static_cast<int>(attr->cqe), attr->cq_context, attr->channel,
                      &cq);
    });
  }
  if (rc != 0) return ObjectOrNull<ibv_cq_ex>(rc, nullptr);
  const uint32_t flags = (attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) ? attr->flags : 0;
  cq->single_threaded = flags & IBV_CREATE_CQ_ATTR_SINGLE_THREADED;
  cq->ignore_overrun = flags & IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN;
  InstallCqExOps(cq, attr->wc_flags);
  return &cq->cqx;
}

}  // namespace ff::verbs

using namespace ff::verbs;

extern "C" {

FFV_EXPORT ibv_pd* ibv_alloc_pd(ibv_context* context) {
  if (context == nullptr) return ObjectOrNull<ibv_pd>(EINVAL, nullptr);
  Pd* pd = nullptr;
  const int rc = Guarded([&] {
    pd = new Pd{};
    pd->pd.context = context;
    pd->pd.handle = NextId(ToCtx(context));
    static std::atomic<uint32_t> next_id{1};
    pd->id = next_id.fetch_add(1, std::memory_order_relaxed);
    return 0;
  });
  return ObjectOrNull(rc, rc == 0 ? &pd->pd : nullptr);
}

FFV_EXPORT int ibv_dealloc_pd(ibv_pd* pd) {
  if (pd == nullptr) return EINVAL;
  if (PdInUse(pd)) return EBUSY;  // as the kernel answers while objects still use it
  delete reinterpret_cast<Pd*>(pd);
  return 0;
}

FFV_EXPORT ibv_comp_channel* ibv_create_comp_channel(ibv_context* context) {
  Channel* ch = nullptr;
  const int rc =
      context == nullptr ? EINVAL : Guarded([&] { return CreateChannel(ToCtx(context), &ch); });
  return ObjectOrNull(rc, rc == 0 ? &ch->ch : nullptr);
}

FFV_EXPORT int ibv_destroy_comp_channel(ibv_comp_channel* channel) {
  if (channel == nullptr) return EINVAL;
  return Guarded([&] { return DestroyChannel(ToChannel(channel)); });
}

FFV_EXPORT ibv_cq* ibv_create_cq(ibv_context* context, int cqe, void* cq_context,
                                 ibv_comp_channel* channel, int comp_vector) {
  if (CheckCqArgs(context, cqe, channel, static_cast<uint32_t>(comp_vector)) != 0)
    return ObjectOrNull<ibv_cq>(EINVAL, nullptr);
  Cq* cq = nullptr;
  const int rc = Guarded([&] { return CreateCq(ToCtx(context), cqe, cq_context, channel, &cq); });
  return ObjectOrNull(rc, rc == 0 ? &cq->cq : nullptr);
}

FFV_EXPORT int ibv_resize_cq(ibv_cq* cq, int cqe) {
  if (cq == nullptr || cqe < 1 || static_cast<uint32_t>(cqe) > ff::kMaxCqe) return EINVAL;
  return Guarded([&] { return ResizeCq(ToCq(cq), cqe); });
}

FFV_EXPORT int ibv_destroy_cq(ibv_cq* cq) {
  if (cq == nullptr) return EINVAL;
  return Guarded([&] { return DestroyCq(ToCq(cq)); });
}

FFV_EXPORT void ibv_ack_cq_events(ibv_cq* cq, unsigned int nevents) {
  if (cq != nullptr) ToCq(cq)->events_acked += nevents;
}

FFV_EXPORT ibv_srq* ibv_create_srq(ibv_pd* pd, ibv_srq_init_attr* attr) {
  if (pd == nullptr || attr == nullptr || attr->attr.max_wr == 0 ||
      attr->attr.max_wr > ff::kMaxQpWr || attr->attr.max_sge > ff::kMaxSge)
    return ObjectOrNull<ibv_srq>(EINVAL, nullptr);
  Srq* srq = nullptr;
  const int rc = Guarded([&] { return CreateSrq(ToCtx(pd->context), pd, attr, &srq); });
  return ObjectOrNull(rc, rc == 0 ? &srq->srq : nullptr);
}

FFV_EXPORT int ibv_modify_srq(ibv_srq* srq, ibv_srq_attr* attr, int mask) {
  if (srq == nullptr || attr == nullptr) return EINVAL;
  return ModifySrq(ToSrq(srq), attr, mask);
}

FFV_EXPORT int ibv_query_srq(ibv_srq* ibsrq, ibv_srq_attr* attr) {
  if (ibsrq == nullptr || attr == nullptr) return EINVAL;
  Srq* srq = ToSrq(ibsrq);
  std::lock_guard<AdaptiveLock> l(srq->ctx->lock);
  attr->max_wr = srq->rq.max_wr;
  attr->max_sge = srq->rq.max_sge;
  attr->srq_limit = srq->limit;
  return 0;
}

FFV_EXPORT int ibv_destroy_srq(ibv_srq* srq) {
  if (srq == nullptr) return EINVAL;
  return Guarded([&] { return DestroySrq(ToSrq(srq)); });
}

FFV_EXPORT ibv_ah* ibv_create_ah(ibv_pd* pd, ibv_ah_attr* attr) {
  Ah* ah = nullptr;
  const int rc =
      pd == nullptr || attr == nullptr ? EINVAL : Guarded([&] { return CreateAh(pd, attr, &ah); });
  if (rc == 0) reinterpret_cast<Pd*>(pd)->ahs.fetch_add(1, std::memory_order_acq_rel);
  return ObjectOrNull(rc, rc == 0 ? &ah->ah : nullptr);
}

FFV_EXPORT int ibv_destroy_ah(ibv_ah* ah) {
  if (ah == nullptr) return EINVAL;
  if (ah->pd != nullptr) reinterpret_cast<Pd*>(ah->pd)->ahs.fetch_sub(1, std::memory_order_acq_rel);
  delete ToAh(ah);
  return 0;
}

FFV_EXPORT int ibv_init_ah_from_wc(ibv_context* context, uint8_t port_num, ibv_wc* wc, ibv_grh* grh,
                                   ibv_ah_attr* ah_attr) {
  if (context == nullptr || wc == nullptr || ah_attr == nullptr || port_num != 1) return -1;
  std::memset(ah_attr, 0, sizeof(*ah_attr));
  ah_attr->dlid = wc->slid;
  ah_attr->port_num = port_num;
  if ((wc->wc_flags & IBV_WC_GRH) && grh != nullptr) {
    ah_attr->is_global = 1;
    ah_attr->grh.dgid = grh->sgid;
    ah_attr->grh.sgid_index = 1;
    ah_attr->grh.hop_limit = 0xff;
  }
  return 0;
}

FFV_EXPORT ibv_ah* ibv_create_ah_from_wc(ibv_pd* pd, ibv_wc* wc, ibv_grh* grh, uint8_t port_num) {
  ibv_ah_attr attr;
  if (pd == nullptr || ibv_init_ah_from_wc(pd->context, port_num, wc, grh, &attr) != 0)
    return ObjectOrNull<ibv_ah>(EINVAL, nullptr);
  return ibv_create_ah(pd, &attr);
}

}  // extern "C"
