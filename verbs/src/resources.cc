// Control verbs: protection domains, completion channels and queues, shared receive
// queues, address handles and queue pairs (create, modify, query, destroy), and the
// connection of a QP to its peer through the router.
#include <arpa/inet.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "exports.h"
#include "freeflow/ipv4.h"
#include "registry.h"

namespace ffv {
namespace {

uint32_t RoundPow2(uint32_t v) {
  uint32_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

std::mutex g_slot_mu;
std::vector<uint32_t> g_free_slots;
uint32_t g_next_slot = 0;

uint32_t AllocNotifySlot() {
  std::lock_guard<std::mutex> g(g_slot_mu);
  if (!g_free_slots.empty()) {
    const uint32_t s = g_free_slots.back();
    g_free_slots.pop_back();
    return s;
  }
  return g_next_slot < ff::proto::kWakeSlot ? g_next_slot++ : ff::proto::kNoId;
}

void FreeNotifySlot(uint32_t s) {
  std::lock_guard<std::mutex> g(g_slot_mu);
  g_free_slots.push_back(s);
}

int SimpleCall(Session* s, const void* req, size_t len) {
  ff::proto::Response r{};
  return s->Call(req, len, nullptr, 0, &r);
}

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

std::shared_ptr<PeerCtx> GetPeerCtx(Context* ctx, uint32_t id, UniqueFd* notify_fd,
                                    UniqueFd* table_fd) {
  auto it = ctx->peers.find(id);
  if (it != ctx->peers.end()) {
    if (auto p = it->second.lock()) return p;
  }
  auto p = std::make_shared<PeerCtx>();
  p->ctx_id = id;
  if (ff::MapPeerSegment(notify_fd->get(), ff::kNotifySegmentBytes, true, &p->notify) != 0 ||
      ff::MapPeerSegment(table_fd->get(), ff::kMrTableBytes, false, &p->mr_table) != 0) {
    return nullptr;
  }
  ctx->peers[id] = p;
  return p;
}

bool TransitionAllowed(ibv_qp_state cur, ibv_qp_state next) {
  if (next == IBV_QPS_RESET || next == IBV_QPS_ERR) return true;
  switch (cur) {
    case IBV_QPS_RESET:
      return next == IBV_QPS_INIT;
    case IBV_QPS_INIT:
      return next == IBV_QPS_INIT || next == IBV_QPS_RTR;
    case IBV_QPS_RTR:
      return next == IBV_QPS_RTS;
    case IBV_QPS_RTS:
    case IBV_QPS_SQE:
      return next == IBV_QPS_RTS;
    default:
      return false;
  }
}

// Attributes the IB specification requires for each transition.
int RequiredMask(ibv_qp_type type, ibv_qp_state cur, ibv_qp_state next) {
  if (cur == IBV_QPS_RESET && next == IBV_QPS_INIT) {
    return type == IBV_QPT_UD ? (IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY)
                              : (IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                 IBV_QP_ACCESS_FLAGS);
  }
  if (cur == IBV_QPS_INIT && next == IBV_QPS_RTR) {
    if (type == IBV_QPT_RC)
      return IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
             IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    if (type == IBV_QPT_UC)
      return IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
    return IBV_QP_STATE;
  }
  if (cur == IBV_QPS_RTR && next == IBV_QPS_RTS) {
    if (type == IBV_QPT_RC)
      return IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
             IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
    return IBV_QP_STATE | IBV_QP_SQ_PSN;
  }
  return IBV_QP_STATE;
}

void ApplyAttr(Qp* qp, const ibv_qp_attr* a, int mask) {
  ibv_qp_attr& s = qp->attr;
  if (mask & IBV_QP_PKEY_INDEX) s.pkey_index = a->pkey_index;
  if (mask & IBV_QP_PORT) s.port_num = a->port_num;
  if (mask & IBV_QP_ACCESS_FLAGS) s.qp_access_flags = a->qp_access_flags;
  if (mask & IBV_QP_QKEY) s.qkey = a->qkey;
  if (mask & IBV_QP_AV) s.ah_attr = a->ah_attr;
  if (mask & IBV_QP_PATH_MTU) s.path_mtu = a->path_mtu;
  if (mask & IBV_QP_DEST_QPN) s.dest_qp_num = a->dest_qp_num;
  if (mask & IBV_QP_RQ_PSN) s.rq_psn = a->rq_psn;
  if (mask & IBV_QP_SQ_PSN) s.sq_psn = a->sq_psn;
  if (mask & IBV_QP_MAX_DEST_RD_ATOMIC) s.max_dest_rd_atomic = a->max_dest_rd_atomic;
  if (mask & IBV_QP_MAX_QP_RD_ATOMIC) s.max_rd_atomic = a->max_rd_atomic;
  if (mask & IBV_QP_MIN_RNR_TIMER) s.min_rnr_timer = a->min_rnr_timer;
  if (mask & IBV_QP_TIMEOUT) s.timeout = a->timeout;
  if (mask & IBV_QP_RETRY_CNT) s.retry_cnt = a->retry_cnt;
  if (mask & IBV_QP_RNR_RETRY) s.rnr_retry = a->rnr_retry;
  if (mask & IBV_QP_ALT_PATH) s.alt_ah_attr = a->alt_ah_attr;
  if (mask & IBV_QP_PATH_MIG_STATE) s.path_mig_state = a->path_mig_state;
}

ibv_qp* CreateQpCommon(Context* ctx, ibv_pd* pd, ibv_qp_init_attr_ex* attr) {
  if (attr->qp_type != IBV_QPT_RC && attr->qp_type != IBV_QPT_UC && attr->qp_type != IBV_QPT_UD) {
    LogError("QP type %d is not supported (RC, UC and UD are)", attr->qp_type);
    errno = EOPNOTSUPP;
    return nullptr;
  }
  ibv_qp_cap& cap = attr->cap;
  if (attr->send_cq == nullptr || attr->recv_cq == nullptr || cap.max_send_wr > ff::kMaxQpWr ||
      cap.max_recv_wr > ff::kMaxQpWr || cap.max_send_sge > ff::kMaxSge ||
      cap.max_recv_sge > ff::kMaxSge || cap.max_inline_data > ff::kMaxInline) {
    errno = EINVAL;
    return nullptr;
  }
  auto qp = std::make_unique<Qp>();
  qp->ctx = ctx;
  qp->type = attr->qp_type;
  qp->scq = ToCq(attr->send_cq);
  qp->rcq = ToCq(attr->recv_cq);
  qp->srq = attr->srq != nullptr ? ToSrq(attr->srq) : nullptr;
  qp->sq_sig_all = attr->sq_sig_all != 0;
  if (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) qp->send_ops_flags = attr->send_ops_flags;
  cap.max_send_wr = std::max<uint32_t>(cap.max_send_wr, 1);
  cap.max_send_sge = std::max<uint32_t>(cap.max_send_sge, 1);
  cap.max_inline_data = ff::kMaxInline;
  if (qp->srq != nullptr) {
    cap.max_recv_wr = 0;
    cap.max_recv_sge = 0;
  } else {
    cap.max_recv_sge = std::max<uint32_t>(cap.max_recv_sge, 1);
  }
  qp->cap = cap;

  const uint32_t sq_cap = RoundPow2(cap.max_send_wr);
  qp->sq_mask = sq_cap - 1;
  qp->sq.assign(sq_cap, SendWqe{});
  qp->sq_sges.assign(static_cast<size_t>(sq_cap) * cap.max_send_sge, ibv_sge{});
  qp->sq_inline.assign(static_cast<size_t>(sq_cap) * ff::kMaxInline, 0);

  qp->num_rings = qp->type == IBV_QPT_UD ? ff::kUdRingsPerQp : 1;
  qp->ring_bytes = qp->type == IBV_QPT_UD ? ff::kUdRingBytes : ff::kRcRingBytes;
  const size_t seg_bytes = ff::QpSegmentBytes(qp->num_rings, qp->ring_bytes);
  int rc = ff::CreateSegment("ffverbs-qp", seg_bytes, &qp->seg_fd);
  if (rc == 0) rc = ff::MapSegment(qp->seg_fd.get(), seg_bytes, true, &qp->seg);
  if (rc != 0) {
    errno = rc;
    return nullptr;
  }
  auto* hdr = new (qp->seg.get()) ff::QpSegmentHeader();
  hdr->magic = ff::kQpSegMagic;
  hdr->abi = ff::kAbiVersion;
  hdr->num_rings = qp->num_rings;
  hdr->ring_bytes = qp->ring_bytes;
  qp->consumers.resize(qp->num_rings);
  qp->inbound.resize(qp->num_rings);
  for (uint32_t i = 0; i < qp->num_rings; ++i) {
    qp->consumers[i].Attach(ff::QpRing(qp->seg.get(), i, qp->ring_bytes), qp->ring_bytes);
  }
  if (qp->srq == nullptr) InitRecvQueue(&qp->rq, cap.max_recv_wr, cap.max_recv_sge, &hdr->credits);

  ff::proto::CreateQp m{};
  m.h.op = ff::proto::Op::kCreateQp;
  m.qp_type = qp->type;
  m.num_rings = qp->num_rings;
  m.ring_bytes = qp->ring_bytes;
  m.srq_id = qp->srq != nullptr ? qp->srq->id : ff::proto::kNoId;
  m.recv_cq_id = qp->rcq->id;
  m.send_cq_id = qp->scq->id;
  ff::proto::Response r{};
  const int fd = qp->seg_fd.get();
  rc = ctx->session->Call(&m, sizeof(m), &fd, 1, &r);
  if (rc != 0) {
    LogError("the router refused to create a QP: %s", std::strerror(rc));
    errno = rc;
    return nullptr;
  }
  ibv_qp& q = qp->qpx.qp_base;
  q.context = &ctx->vctx.context;
  q.qp_context = attr->qp_context;
  q.pd = pd;
  q.send_cq = attr->send_cq;
  q.recv_cq = attr->recv_cq;
  q.srq = attr->srq;
  q.handle = r.u.create_qp.qpn;
  q.qp_num = r.u.create_qp.qpn;
  q.state = IBV_QPS_RESET;
  q.qp_type = attr->qp_type;
  pthread_mutex_init(&q.mutex, nullptr);
  pthread_cond_init(&q.cond, nullptr);
  InitQpEx(qp.get());
  Qp* raw = qp.release();
  {
    std::lock_guard<SpinLock> l(ctx->lock);
    ctx->qps.push_back(raw);
    raw->rcq->recv_qps.push_back(raw);
  }
  Registry::Get().AddQp(q.qp_num, raw);
  return &q;
}

}  // namespace

ibv_qp* CreateQpEx(ibv_context* context, ibv_qp_init_attr_ex* attr) {
  if (context == nullptr || attr == nullptr || !(attr->comp_mask & IBV_QP_INIT_ATTR_PD) ||
      (attr->comp_mask & ~(IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS)) != 0) {
    errno = attr != nullptr && (attr->comp_mask & ~(IBV_QP_INIT_ATTR_PD |
                                                    IBV_QP_INIT_ATTR_SEND_OPS_FLAGS))
                ? EOPNOTSUPP
                : EINVAL;
    return nullptr;
  }
  return CreateQpCommon(ToCtx(context), attr->pd, attr);
}

// Who is at the other end, as the router's connect answer names it.
void SetPeerIdentity(PeerLink* link, const ff::proto::ConnectReply& c) {
  link->peer_ctx_id = c.peer_ctx_id;
  link->peer_qpn = c.peer_qpn;
  link->peer_ip = ntohl(c.peer_ip);
  link->peer_lid = c.peer_lid;
  link->qp_type = c.peer_qp_type;
}

// The peer lives on another node: the router gave us its proxy segment (ring 0 for our
// requests, ring 1 for its responses) and the eventfd that wakes it.
int ConnectRemote(const ff::proto::ConnectReply& c, UniqueFd* fds, int got,
                  std::unique_ptr<PeerLink>* out) {
  if (got != ff::proto::ConnectReplyFds(c)) return EPROTO;
  auto link = std::make_unique<PeerLink>();
  link->remote = true;
  SetPeerIdentity(link.get(), c);
  const size_t seg_bytes = ff::QpSegmentBytes(ff::kProxyRings, c.ring_bytes);
  if (ff::MapPeerSegment(fds[0].get(), seg_bytes, true, &link->seg) != 0) return EPROTO;
  link->hdr = link->seg.as<ff::QpSegmentHeader>();
  if (link->hdr->magic != ff::kQpSegMagic) return EPROTO;
  link->producer.Attach(ff::QpRing(link->seg.get(), ff::kProxyRequestRing, c.ring_bytes),
                        c.ring_bytes);
  link->responses.Attach(ff::QpRing(link->seg.get(), ff::kProxyResponseRing, c.ring_bytes),
                         c.ring_bytes);
  link->notify = &link->hdr->doorbell;
  link->notify_fd = std::move(fds[1]);
  *out = std::move(link);
  return 0;
}

int ConnectLink(Qp* qp, uint32_t dest_ip, uint16_t dest_lid, uint32_t dest_qpn, bool ud,
                std::unique_ptr<PeerLink>* out) {
  Context* ctx = qp->ctx;
  ff::proto::ConnectQp m{};
  m.h.op = ud ? ff::proto::Op::kResolveUd : ff::proto::Op::kConnectQp;
  m.qpn = qp->qpx.qp_base.qp_num;
  m.dest_ip = htonl(dest_ip);
  m.dest_lid = dest_lid;
  m.dest_qpn = dest_qpn;
  ff::proto::Response r{};
  UniqueFd fds[5];
  int got = 0;
  const int rc = ctx->session->Call(&m, sizeof(m), nullptr, 0, &r, fds, 5, &got);
  if (rc != 0) return rc;
  const ff::proto::ConnectReply& c = r.u.connect;
  if (c.flags & ff::proto::kConnectRemote) return ConnectRemote(c, fds, got, out);
  if (got != ff::proto::ConnectReplyFds(c)) return EPROTO;
  auto link = std::make_unique<PeerLink>();
  SetPeerIdentity(link.get(), c);
  const size_t seg_bytes = ff::QpSegmentBytes(c.num_rings, c.ring_bytes);
  if (ff::MapPeerSegment(fds[0].get(), seg_bytes, true, &link->seg) != 0) return EPROTO;
  link->hdr = link->seg.as<ff::QpSegmentHeader>();
  if (link->hdr->magic != ff::kQpSegMagic) return EPROTO;
  int next = 3;
  if (c.notify_slot != ff::proto::kNoId) link->notify_fd = std::move(fds[next++]);
  if (c.has_srq) {
    if (ff::MapPeerSegment(fds[next].get(), sizeof(ff::SrqSegment), true, &link->srq_seg) != 0)
      return EPROTO;
    link->credits = &link->srq_seg.as<ff::SrqSegment>()->credits;
  } else {
    link->credits = &link->hdr->credits;
  }
  link->pctx = GetPeerCtx(ctx, c.peer_ctx_id, &fds[1], &fds[2]);
  if (link->pctx == nullptr) return EPROTO;
  if (c.notify_slot != ff::proto::kNoId) {
    link->notify = link->pctx->notify.as<ff::NotifySlot>() + c.notify_slot;
  }
  link->producer.Attach(ff::QpRing(link->seg.get(), c.ring_index, c.ring_bytes), c.ring_bytes);
  *out = std::move(link);
  return 0;
}

Mapping* PeerRegion(Qp* qp, PeerLink* link, uint32_t region_id) {
  PeerCtx* p = link->pctx.get();
  if (p->last_region == region_id) return p->last_mapping;
  auto it = p->regions.find(region_id);
  if (it == p->regions.end()) {
    ff::proto::GetRegion m{};
    m.h.op = ff::proto::Op::kGetRegion;
    m.qpn = qp->qpx.qp_base.qp_num;
    m.region_id = region_id;
    ff::proto::Response r{};
    UniqueFd fd;
    int got = 0;
    if (qp->ctx->session->Call(&m, sizeof(m), nullptr, 0, &r, &fd, 1, &got) != 0 || got != 1)
      return nullptr;
    const uint64_t size = r.u.region.size;
    Mapping map;
    if (size == 0 || ff::MapPeerSegment(fd.get(), size, true, &map) != 0)
      return nullptr;
    it = p->regions.emplace(region_id, std::move(map)).first;
  }
  p->last_region = region_id;
  p->last_mapping = &it->second;
  return &it->second;
}

}  // namespace ffv

using namespace ffv;

extern "C" {

FFV_EXPORT ibv_pd* ibv_alloc_pd(ibv_context* context) {
  if (context == nullptr) {
    errno = EINVAL;
    return nullptr;
  }
  auto* pd = new Pd{};
  pd->pd.context = context;
  pd->pd.handle = ToCtx(context)->next_id++;
  return &pd->pd;
}

FFV_EXPORT int ibv_dealloc_pd(ibv_pd* pd) {
  if (pd == nullptr) return EINVAL;
  delete reinterpret_cast<Pd*>(pd);
  return 0;
}

FFV_EXPORT ibv_comp_channel* ibv_create_comp_channel(ibv_context* context) {
  if (context == nullptr) {
    errno = EINVAL;
    return nullptr;
  }
  Context* ctx = ToCtx(context);
  auto ch = std::make_unique<Channel>();
  ch->ctx = ctx;
  ch->ch.context = context;
  ch->ch.fd = ::eventfd(0, EFD_CLOEXEC);
  if (ch->ch.fd < 0) return nullptr;
  {
    std::lock_guard<SpinLock> l(ctx->lock);
    ch->id = ctx->next_id++;
  }
  ff::proto::CreateChannel m{};
  m.h.op = ff::proto::Op::kCreateChannel;
  m.chan_id = ch->id;
  ff::proto::Response r{};
  const int rc = ctx->session->Call(&m, sizeof(m), &ch->ch.fd, 1, &r);
  if (rc != 0) {
    ::close(ch->ch.fd);
    errno = rc;
    return nullptr;
  }
  std::lock_guard<SpinLock> l(ctx->lock);
  ctx->channels.push_back(ch.get());
  return &ch.release()->ch;
}

FFV_EXPORT int ibv_destroy_comp_channel(ibv_comp_channel* channel) {
  if (channel == nullptr) return EINVAL;
  Channel* ch = ToChannel(channel);
  Context* ctx = ch->ctx;
  {
    std::lock_guard<SpinLock> l(ctx->lock);
    if (!ch->cqs.empty()) return EBUSY;
    ctx->channels.erase(std::remove(ctx->channels.begin(), ctx->channels.end(), ch),
                        ctx->channels.end());
  }
  ff::proto::DestroyChannel m{};
  m.h.op = ff::proto::Op::kDestroyChannel;
  m.chan_id = ch->id;
  SimpleCall(ctx->session, &m, sizeof(m));
  ::close(channel->fd);
  delete ch;
  return 0;
}

FFV_EXPORT ibv_cq* ibv_create_cq(ibv_context* context, int cqe, void* cq_context,
                                 ibv_comp_channel* channel, int comp_vector) {
  if (context == nullptr || cqe < 1 || static_cast<uint32_t>(cqe) > ff::kMaxCqe ||
      comp_vector != 0) {
    errno = EINVAL;
    return nullptr;
  }
  Context* ctx = ToCtx(context);
  auto cq = std::make_unique<Cq>();
  cq->ctx = ctx;
  cq->capacity = static_cast<uint32_t>(cqe);
  const uint32_t size = RoundPow2(static_cast<uint32_t>(cqe) + 1);
  cq->wcs.resize(size);
  cq->mask = size - 1;
  if (channel != nullptr) {
    cq->channel = ToChannel(channel);
    cq->notify_slot = AllocNotifySlot();
    if (cq->notify_slot == ff::proto::kNoId) {
      errno = ENOSPC;
      return nullptr;
    }
    ff::NotifySlot* slot = ctx->session->notify.as<ff::NotifySlot>() + cq->notify_slot;
    slot->armed.store(0);
    slot->fired.store(0);
  }
  {
    std::lock_guard<SpinLock> l(ctx->lock);
    cq->id = ctx->next_id++;
  }
  ff::proto::CreateCq m{};
  m.h.op = ff::proto::Op::kCreateCq;
  m.cq_id = cq->id;
  m.notify_slot = cq->notify_slot;
  m.chan_id = cq->channel != nullptr ? cq->channel->id : ff::proto::kNoId;
  const int rc = SimpleCall(ctx->session, &m, sizeof(m));
  if (rc != 0) {
    if (cq->notify_slot != ff::proto::kNoId) FreeNotifySlot(cq->notify_slot);
    errno = rc;
    return nullptr;
  }
  cq->cq.context = context;
  cq->cq.channel = channel;
  cq->cq.cq_context = cq_context;
  cq->cq.handle = cq->id;
  cq->cq.cqe = cqe;
  pthread_mutex_init(&cq->cq.mutex, nullptr);
  pthread_cond_init(&cq->cq.cond, nullptr);
  std::lock_guard<SpinLock> l(ctx->lock);
  ctx->cqs.push_back(cq.get());
  if (cq->channel != nullptr) cq->channel->cqs.push_back(cq.get());
  return &cq.release()->cq;
}

FFV_EXPORT int ibv_resize_cq(ibv_cq* ibcq, int cqe) {
  if (ibcq == nullptr || cqe < 1 || static_cast<uint32_t>(cqe) > ff::kMaxCqe) return EINVAL;
  Cq* cq = ToCq(ibcq);
  std::lock_guard<SpinLock> l(cq->ctx->lock);
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
  ibcq->cqe = cqe;
  return 0;
}

FFV_EXPORT int ibv_destroy_cq(ibv_cq* ibcq) {
  if (ibcq == nullptr) return EINVAL;
  Cq* cq = ToCq(ibcq);
  Context* ctx = cq->ctx;
  {
    std::lock_guard<SpinLock> l(ctx->lock);
    for (Qp* qp : ctx->qps)
      if (qp->scq == cq || qp->rcq == cq) return EBUSY;
    ctx->cqs.erase(std::remove(ctx->cqs.begin(), ctx->cqs.end(), cq), ctx->cqs.end());
    if (cq->channel != nullptr) {
      auto& v = cq->channel->cqs;
      v.erase(std::remove(v.begin(), v.end(), cq), v.end());
    }
  }
  ff::proto::DestroyCq m{};
  m.h.op = ff::proto::Op::kDestroyCq;
  m.cq_id = cq->id;
  SimpleCall(ctx->session, &m, sizeof(m));
  if (cq->notify_slot != ff::proto::kNoId) FreeNotifySlot(cq->notify_slot);
  pthread_mutex_destroy(&ibcq->mutex);
  pthread_cond_destroy(&ibcq->cond);
  delete cq;
  return 0;
}

FFV_EXPORT void ibv_ack_cq_events(ibv_cq* cq, unsigned int nevents) {
  if (cq != nullptr) ToCq(cq)->events_acked += nevents;
}

FFV_EXPORT ibv_srq* ibv_create_srq(ibv_pd* pd, ibv_srq_init_attr* attr) {
  if (pd == nullptr || attr == nullptr || attr->attr.max_wr == 0 ||
      attr->attr.max_wr > ff::kMaxQpWr || attr->attr.max_sge > ff::kMaxSge) {
    errno = EINVAL;
    return nullptr;
  }
  Context* ctx = ToCtx(pd->context);
  auto srq = std::make_unique<Srq>();
  srq->ctx = ctx;
  int rc = ff::CreateSegment("ffverbs-srq", sizeof(ff::SrqSegment), &srq->seg_fd);
  if (rc == 0) rc = ff::MapSegment(srq->seg_fd.get(), sizeof(ff::SrqSegment), true, &srq->seg);
  if (rc != 0) {
    errno = rc;
    return nullptr;
  }
  auto* seg = new (srq->seg.get()) ff::SrqSegment();
  InitRecvQueue(&srq->rq, attr->attr.max_wr, attr->attr.max_sge, &seg->credits);
  srq->limit = attr->attr.srq_limit;
  {
    std::lock_guard<SpinLock> l(ctx->lock);
    srq->id = ctx->next_id++;
  }
  ff::proto::CreateSrq m{};
  m.h.op = ff::proto::Op::kCreateSrq;
  m.srq_id = srq->id;
  ff::proto::Response r{};
  const int fd = srq->seg_fd.get();
  rc = ctx->session->Call(&m, sizeof(m), &fd, 1, &r);
  if (rc != 0) {
    errno = rc;
    return nullptr;
  }
  attr->attr.max_sge = srq->rq.max_sge;
  srq->srq.context = pd->context;
  srq->srq.srq_context = attr->srq_context;
  srq->srq.pd = pd;
  srq->srq.handle = srq->id;
  pthread_mutex_init(&srq->srq.mutex, nullptr);
  pthread_cond_init(&srq->srq.cond, nullptr);
  std::lock_guard<SpinLock> l(ctx->lock);
  ctx->srqs.push_back(srq.get());
  return &srq.release()->srq;
}

FFV_EXPORT int ibv_modify_srq(ibv_srq* ibsrq, ibv_srq_attr* attr, int mask) {
  if (ibsrq == nullptr || attr == nullptr) return EINVAL;
  Srq* srq = ToSrq(ibsrq);
  std::lock_guard<SpinLock> l(srq->ctx->lock);
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

FFV_EXPORT int ibv_query_srq(ibv_srq* ibsrq, ibv_srq_attr* attr) {
  if (ibsrq == nullptr || attr == nullptr) return EINVAL;
  Srq* srq = ToSrq(ibsrq);
  attr->max_wr = srq->rq.max_wr;
  attr->max_sge = srq->rq.max_sge;
  attr->srq_limit = srq->limit;
  return 0;
}

FFV_EXPORT int ibv_destroy_srq(ibv_srq* ibsrq) {
  if (ibsrq == nullptr) return EINVAL;
  Srq* srq = ToSrq(ibsrq);
  Context* ctx = srq->ctx;
  {
    std::lock_guard<SpinLock> l(ctx->lock);
    for (Qp* qp : ctx->qps)
      if (qp->srq == srq) return EBUSY;
    ctx->srqs.erase(std::remove(ctx->srqs.begin(), ctx->srqs.end(), srq), ctx->srqs.end());
  }
  ff::proto::DestroySrq m{};
  m.h.op = ff::proto::Op::kDestroySrq;
  m.srq_id = srq->id;
  SimpleCall(ctx->session, &m, sizeof(m));
  delete srq;
  return 0;
}

FFV_EXPORT ibv_ah* ibv_create_ah(ibv_pd* pd, ibv_ah_attr* attr) {
  if (pd == nullptr || attr == nullptr) {
    errno = EINVAL;
    return nullptr;
  }
  auto ah = std::make_unique<Ah>();
  if (attr->is_global) {
    auto ip = ff::IpFromGid(attr->grh.dgid.raw);
    if (!ip) {
      LogError("address handles need an IPv4-mapped GID (GID index 1 of the virtual port)");
      errno = EINVAL;
      return nullptr;
    }
    ah->ip = *ip;
  } else {
    ah->lid = attr->dlid;
    if (ah->lid == 0) {
      errno = EINVAL;
      return nullptr;
    }
  }
  ah->ah.context = pd->context;
  ah->ah.pd = pd;
  return &ah.release()->ah;
}

FFV_EXPORT int ibv_destroy_ah(ibv_ah* ah) {
  if (ah == nullptr) return EINVAL;
  delete ToAh(ah);
  return 0;
}

FFV_EXPORT int ibv_init_ah_from_wc(ibv_context* context, uint8_t port_num, ibv_wc* wc,
                                   ibv_grh* grh, ibv_ah_attr* ah_attr) {
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
  if (pd == nullptr || ibv_init_ah_from_wc(pd->context, port_num, wc, grh, &attr) != 0) {
    errno = EINVAL;
    return nullptr;
  }
  return ibv_create_ah(pd, &attr);
}

FFV_EXPORT ibv_qp* ibv_create_qp(ibv_pd* pd, ibv_qp_init_attr* attr) {
  if (pd == nullptr || attr == nullptr) {
    errno = EINVAL;
    return nullptr;
  }
  ibv_qp_init_attr_ex ex{};
  ex.qp_context = attr->qp_context;
  ex.send_cq = attr->send_cq;
  ex.recv_cq = attr->recv_cq;
  ex.srq = attr->srq;
  ex.cap = attr->cap;
  ex.qp_type = attr->qp_type;
  ex.sq_sig_all = attr->sq_sig_all;
  ex.comp_mask = IBV_QP_INIT_ATTR_PD;
  ex.pd = pd;
  ibv_qp* qp = CreateQpCommon(ToCtx(pd->context), pd, &ex);
  if (qp != nullptr) attr->cap = ex.cap;
  return qp;
}

FFV_EXPORT int ibv_modify_qp(ibv_qp* ibqp, ibv_qp_attr* attr, int mask) {
  if (ibqp == nullptr || attr == nullptr) return EINVAL;
  Qp* qp = ToQp(ibqp);
  Context* ctx = qp->ctx;
  const ibv_qp_state cur = ibqp->state;
  const ibv_qp_state next = (mask & IBV_QP_STATE) ? attr->qp_state : cur;
  if (!TransitionAllowed(cur, next)) return EINVAL;
  const int required = (mask & IBV_QP_STATE) ? RequiredMask(qp->type, cur, next) : 0;
  if ((mask & required) != required) return EINVAL;
  if ((mask & IBV_QP_PORT) && attr->port_num != 1) return EINVAL;
  if ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && attr->max_dest_rd_atomic > ff::kMaxRdAtomic)
    return EINVAL;
  if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && attr->max_rd_atomic > ff::kMaxRdAtomic) return EINVAL;

  // Connecting asks the router; do it before taking the data-path lock.
  std::unique_ptr<PeerLink> link;
  if (cur == IBV_QPS_INIT && next == IBV_QPS_RTR && qp->type != IBV_QPT_UD) {
    const ibv_ah_attr& ah = attr->ah_attr;
    uint32_t ip = 0;
    if (ah.is_global) {
      auto parsed = ff::IpFromGid(ah.grh.dgid.raw);
      if (!parsed) {
        LogError("QP 0x%x: destination GID is not IPv4-mapped; use GID index 1",
                 ibqp->qp_num);
        return EINVAL;
      }
      ip = *parsed;
    } else if (ah.dlid == 0) {
      LogError("QP 0x%x: destination has neither a GID nor a LID", ibqp->qp_num);
      return EINVAL;
    }
    const int rc = ConnectLink(qp, ip, ah.dlid, attr->dest_qp_num, false, &link);
    if (rc != 0) {
      LogError("QP 0x%x: cannot connect to QP 0x%x at %s: %s", ibqp->qp_num, attr->dest_qp_num,
               ip != 0 ? ff::FormatIpv4(ip).c_str() : ("LID " + std::to_string(ah.dlid)).c_str(),
               std::strerror(rc));
      return rc;
    }
  }
  bool disconnect = false;
  {
    std::lock_guard<SpinLock> l(ctx->lock);
    ApplyAttr(qp, attr, mask);
    if (mask & IBV_QP_MIN_RNR_TIMER) {
      qp->seg.as<ff::QpSegmentHeader>()->min_rnr_timer.store(attr->min_rnr_timer);
    }
    if (mask & IBV_QP_ACCESS_FLAGS) {
      qp->seg.as<ff::QpSegmentHeader>()->qp_access.store(attr->qp_access_flags);
    }
    if (link) {
      // Only a new link replaces the old one (RTR); later transitions keep it.
      if (qp->link && qp->link->remote) --ctx->remote_links;
      if (link->remote) ++ctx->remote_links;
      qp->link = std::move(link);
    }
    if (mask & IBV_QP_STATE) {
      if (next == IBV_QPS_ERR && cur != IBV_QPS_ERR) {
        ibqp->state = IBV_QPS_ERR;
        FailQp(qp, IBV_WC_WR_FLUSH_ERR);
      } else if (next == IBV_QPS_RESET) {
        ResetQueues(qp);
        disconnect = cur != IBV_QPS_RESET;
      }
      ibqp->state = next;
      qp->attr.qp_state = next;
    }
  }
  if (disconnect) {
    ff::proto::DisconnectQp m{};
    m.h.op = ff::proto::Op::kDisconnectQp;
    m.qpn = ibqp->qp_num;
    SimpleCall(ctx->session, &m, sizeof(m));
    std::lock_guard<SpinLock> l(ctx->lock);
    if (qp->link && qp->link->remote) --ctx->remote_links;
    for (auto& [key, l2] : qp->ud_links)
      if (l2->remote) --ctx->remote_links;
    qp->link.reset();
    qp->ud_links.clear();
    qp->peer_gone.store(0);
  }
  return 0;
}

FFV_EXPORT int ibv_query_qp(ibv_qp* ibqp, ibv_qp_attr* attr, int, ibv_qp_init_attr* init) {
  if (ibqp == nullptr || attr == nullptr) return EINVAL;
  Qp* qp = ToQp(ibqp);
  std::lock_guard<SpinLock> l(qp->ctx->lock);
  *attr = qp->attr;
  attr->qp_state = ibqp->state;
  attr->cur_qp_state = ibqp->state;
  attr->cap = qp->cap;
  attr->port_num = attr->port_num == 0 ? 1 : attr->port_num;
  if (init != nullptr) {
    std::memset(init, 0, sizeof(*init));
    init->qp_context = ibqp->qp_context;
    init->send_cq = ibqp->send_cq;
    init->recv_cq = ibqp->recv_cq;
    init->srq = ibqp->srq;
    init->cap = qp->cap;
    init->qp_type = qp->type;
    init->sq_sig_all = qp->sq_sig_all ? 1 : 0;
  }
  return 0;
}

FFV_EXPORT int ibv_destroy_qp(ibv_qp* ibqp) {
  if (ibqp == nullptr) return EINVAL;
  Qp* qp = ToQp(ibqp);
  Context* ctx = qp->ctx;
  Registry::Get().RemoveQp(ibqp->qp_num);
  {
    std::lock_guard<SpinLock> l(ctx->lock);
    ctx->qps.erase(std::remove(ctx->qps.begin(), ctx->qps.end(), qp), ctx->qps.end());
    ctx->pending.erase(std::remove(ctx->pending.begin(), ctx->pending.end(), qp),
                       ctx->pending.end());
    auto& v = qp->rcq->recv_qps;
    v.erase(std::remove(v.begin(), v.end(), qp), v.end());
    if (qp->link && qp->link->remote) --ctx->remote_links;
    for (auto& [key, l2] : qp->ud_links)
      if (l2->remote) --ctx->remote_links;
  }
  ff::proto::DestroyQp m{};
  m.h.op = ff::proto::Op::kDestroyQp;
  m.qpn = ibqp->qp_num;
  SimpleCall(ctx->session, &m, sizeof(m));
  pthread_mutex_destroy(&ibqp->mutex);
  pthread_cond_destroy(&ibqp->cond);
  delete qp;
  return 0;
}

}  // extern "C"
