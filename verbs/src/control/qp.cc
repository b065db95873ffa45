// Queue pairs: create, modify (the state machine, and connecting at RTR), query, destroy.
#include <arpa/inet.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "base/exports.h"
#include "datapath/link.h"
#include "datapath/recv_path.h"
#include "datapath/send_queue.h"
#include "direct/direct.h"
#include "freeflow/ipv4.h"
#include "rdmacm/cm_channel.h"
#include "session/session.h"

namespace ff::verbs {
namespace {

bool TransitionAllowed(ibv_qp_state cur, ibv_qp_state next) {
  if (next == IBV_QPS_RESET || next == IBV_QPS_ERR) return true;
  switch (cur) {
    case IBV_QPS_RESET:
      return next == IBV_QPS_INIT;
    case IBV_QPS_INIT:
      return next == IBV_QPS_INIT || next == IBV_QPS_RTR;
    case IBV_QPS_RTR:
    case IBV_QPS_RTS:
    case IBV_QPS_SQE:
      return next == IBV_QPS_RTS;
    default:
      return false;
  }
}

// Attributes the IB specification requires for each transition.
int RequiredMask(const ff::QpKind* kind, ibv_qp_state cur, ibv_qp_state next) {
  if (cur == IBV_QPS_RESET && next == IBV_QPS_INIT) return kind->init_attrs;
  if (cur == IBV_QPS_INIT && next == IBV_QPS_RTR) return kind->rtr_attrs;
  if (cur == IBV_QPS_RTR && next == IBV_QPS_RTS) return kind->rts_attrs;
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
  // What senders read from our segment.
  auto* hdr = qp->inbound.seg.as<ff::QpSegmentHeader>();
  if (mask & IBV_QP_MIN_RNR_TIMER) hdr->min_rnr_timer.store(a->min_rnr_timer);
  if (mask & IBV_QP_ACCESS_FLAGS) hdr->qp_access.store(a->qp_access_flags);
}

int CheckCaps(const ibv_qp_init_attr_ex* attr) {
  if (ff::QpKindOf(attr->qp_type) == nullptr) {
    LogError("QP type %d is not supported (RC, UC and UD are)", attr->qp_type);
    return EOPNOTSUPP;
  }
  const ibv_qp_cap& cap = attr->cap;
  if (attr->send_cq == nullptr || attr->recv_cq == nullptr || cap.max_send_wr > ff::kMaxQpWr ||
      cap.max_recv_wr > ff::kMaxQpWr || cap.max_send_sge > ff::kMaxSge ||
      cap.max_recv_sge > ff::kMaxSge || cap.max_inline_data > ff::kMaxInline)
    return EINVAL;
  // Its CQs and SRQ must belong to the PD's device context.
  const ibv_context* c = attr->pd->context;
  if (attr->send_cq->context != c || attr->recv_cq->context != c ||
      (attr->srq != nullptr && attr->srq->context != c))
    return EINVAL;
  return 0;
}

// Sizes the queues; `attr->cap` becomes what the QP really has.
void InitQueues(Qp* qp, ibv_qp_init_attr_ex* attr) {
  ibv_qp_cap& cap = attr->cap;
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
  qp->sq.Size(RoundPow2(cap.max_send_wr), cap.max_send_sge);
}

// An RC/UC QP's inbound ring is a bounce buffer between the sender's copy and ours. Sized
// by how much the application means to have in flight (its receive queue depth): a deeper
// ring lets a sender run ahead while we sleep in ibv_get_cq_event (qperf rc_bw: 3 GB/s with
// 512 KiB, 7.5 GB/s with 2 MiB). Pages are touched only as traffic reaches them.
uint32_t RcRingBytes(const Qp* qp) {
  const uint32_t depth = qp->srq != nullptr ? qp->srq->rq.max_wr : qp->cap.max_recv_wr;
  const uint64_t want =
      static_cast<uint64_t>(RoundPow2(std::max(depth, 1u))) * ff::kRcRingBytesPerRecv;
  return static_cast<uint32_t>(std::clamp<uint64_t>(want, ff::kRcRingBytes, ff::kMaxRcRingBytes));
}

// Spare QP segments. A QP's segment is a memfd that peers map to produce into its rings,
// and a shared mapping cannot be taken back: a segment that ever left this process is
// never used again. One that never did (the router closes its seal set before it gives it
// to anyone or maps it for remote senders: ff::SealsFrozen) is kept when its RC/UC QP is
// destroyed, still mapped, and becomes the segment of the next QP of its size once the
// router has served the destroy (nothing can take it out after that). Making, mapping,
// touching, unmapping and closing a memfd cost a QP's create and destroy about 28 us here,
// besides the router's work on it: an rdma_cm connection without data on one node went from
// 4,811 to 7,639 a second without them (docs/router.md).
void KeepSpare(Session* s, UniqueFd fd, ff::Mapping map, uint64_t served_at) {
  if (served_at == 0 || ff::SealsFrozen(fd.get())) return;  // it left the process
  // Declared before the lock: one that makes room is unmapped and closed after it.
  Session::SpareSegment dropped;
  std::lock_guard<std::mutex> g(s->spare_mu);
  if (s->spare_segments.size() >= ff::kSpareQpSegments) {
    dropped = std::move(s->spare_segments.front());
    s->spare_segments.pop_front();
  }
  s->spare_segments.push_back({std::move(fd), std::move(map), served_at});
}

// A spare segment of `bytes` for a new QP, when there is one the router is done with.
bool TakeSpare(Session* s, size_t bytes, UniqueFd* fd, ff::Mapping* map) {
  std::vector<Session::SpareSegment> dropped;
  std::lock_guard<std::mutex> g(s->spare_mu);
  for (auto it = s->spare_segments.begin(); it != s->spare_segments.end();) {
    if (it->map.size() != bytes || !s->Served(it->served_at)) {
      ++it;
    } else if (ff::SealsFrozen(it->fd.get())) {  // given out just before its destroy
      dropped.push_back(std::move(*it));
      it = s->spare_segments.erase(it);
    } else {
      *fd = std::move(it->fd);
      *map = std::move(it->map);
      s->spare_segments.erase(it);
      return true;
    }
  }
  return false;
}

// The QP's own segment: its inbound rings and receive credits, which peers map.
int InitSegment(Qp* qp, const ibv_pd* pd) {
  Inbound& in = qp->inbound;
  in.num_rings = qp->kind->rings;
  in.ring_bytes = qp->kind->ring_bytes != 0 ? qp->kind->ring_bytes : RcRingBytes(qp);
  const size_t seg_bytes = ff::QpSegmentBytes(in.num_rings, in.ring_bytes);
  if (!qp->kind->datagram && TakeSpare(qp->ctx->session, seg_bytes, &in.seg_fd, &in.seg)) {
    // Only this process ever wrote it: its rings start over, empty.
    for (uint32_t i = 0; i < in.num_rings; ++i)
      new (ff::QpRing(in.seg.get(), i, in.ring_bytes)) ff::RingHeader();
  } else {
    int rc = ff::CreateSegment("ffverbs-qp", seg_bytes, &in.seg_fd);
    if (rc == 0) rc = ff::MapSegment(in.seg_fd.get(), seg_bytes, true, &in.seg);
    if (rc != 0) return rc;
  }
  auto* hdr = new (in.seg.get()) ff::QpSegmentHeader();
  hdr->magic = ff::kQpSegMagic;
  hdr->abi = ff::kAbiVersion;
  hdr->num_rings = in.num_rings;
  hdr->ring_bytes = in.ring_bytes;
  hdr->pd.store(PdId(pd), std::memory_order_relaxed);
  in.consumers.resize(in.num_rings);
  in.messages.resize(in.num_rings);
  // A UD QP's senders each get a ring of their own from the router (InstallRings); the
  // rings in its segment stay unused.
  if (qp->kind->datagram) in.sources.resize(in.num_rings);
  for (uint32_t i = 0; i < in.num_rings && !qp->kind->datagram; ++i)
    in.consumers[i].Attach(ff::QpRing(in.seg.get(), i, in.ring_bytes), in.ring_bytes);
  if (qp->srq == nullptr)
    InitRecvQueue(&in.rq, qp->cap.max_recv_wr, qp->cap.max_recv_sge, &hdr->credits);
  return 0;
}

int AnnounceQp(Qp* qp, uint32_t* qpn) {
  ff::proto::CreateQp m{};
  m.qp_type = qp->kind->type;
  m.num_rings = qp->inbound.num_rings;
  m.ring_bytes = qp->inbound.ring_bytes;
  m.srq_id = qp->srq != nullptr ? qp->srq->id : ff::proto::kNoId;
  m.recv_cq_id = qp->rcq->id;
  m.send_cq_id = qp->scq->id;
  const int fd = qp->inbound.seg_fd.get();
  Session* s = qp->ctx->session;
  std::lock_guard<std::mutex> g(s->qpn_mu);
  // An RC/UC QP under a granted number: what the router checks is the library's own doing
  // (CheckCaps, InitSegment, the CQs and SRQ it created), so its answer would only be the
  // number. Posted, the create costs no wait for the router.
  if (qp->kind->posted_create && !s->qpn_grants.empty()) {
    m.qpn = s->qpn_grants.back();
    // Known to the event thread first: a refusal (kQpRefused) may come back at once.
    s->registry.AddQp(m.qpn, qp);
    if (s->Post(&m, sizeof(m), &fd, 1) == 0) {
      s->qpn_grants.pop_back();
      *qpn = m.qpn;
      return 0;
    }
    s->registry.RemoveQp(m.qpn);
    m.qpn = 0;  // the router is gone: the call says so
  }
  ff::proto::Response r{};
  const int rc = s->Call(&m, sizeof(m), &fd, 1, &r);
  s->qpn_grants.clear();
  if (r.h.op == ff::proto::Op::kCreateQp) {  // the router's answer, refusal or not
    const ff::proto::CreateQpReply& c = r.u.create_qp;
    s->qpn_grants.assign(c.grant, c.grant + std::min(c.grant_count, ff::proto::kQpnGrant));
  }
  if (rc != 0) {
    LogError("the router refused to create a QP: %s", std::strerror(rc));
    return rc;
  }
  *qpn = r.u.create_qp.qpn;
  return 0;
}

void FillIbvQp(Qp* qp, ibv_pd* pd, const ibv_qp_init_attr_ex* attr, uint32_t qpn) {
  ibv_qp& q = qp->qpx.qp_base;
  q.context = &qp->ctx->vctx.context;
  q.qp_context = attr->qp_context;
  q.pd = pd;
  q.send_cq = attr->send_cq;
  q.recv_cq = attr->recv_cq;
  q.srq = attr->srq;
  q.handle = qpn;
  q.qp_num = qpn;
  q.state = IBV_QPS_RESET;
  q.qp_type = attr->qp_type;
  pthread_mutex_init(&q.mutex, nullptr);
  pthread_cond_init(&q.cond, nullptr);
}

int CreateQp(Context* ctx, ibv_pd* pd, ibv_qp_init_attr_ex* attr, Qp** out) {
  if (const int rc = CheckCaps(attr)) return rc;
  auto qp = std::make_unique<Qp>();
  qp->ctx = ctx;
  qp->kind = ff::QpKindOf(attr->qp_type);
  qp->scq = ToCq(attr->send_cq);
  qp->rcq = ToCq(attr->recv_cq);
  qp->srq = attr->srq != nullptr ? ToSrq(attr->srq) : nullptr;
  qp->sq_sig_all = attr->sq_sig_all != 0;
  if (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) qp->send_ops_flags = attr->send_ops_flags;
  InitQueues(qp.get(), attr);
  if (const int rc = InitSegment(qp.get(), pd)) return rc;
  uint32_t qpn = 0;
  if (const int rc = AnnounceQp(qp.get(), &qpn)) return rc;
  FillIbvQp(qp.get(), pd, attr, qpn);
  InitQpEx(qp.get());
  {
    std::lock_guard<AdaptiveLock> l(ctx->lock);
    ctx->qps.push_back(qp.get());
    qp->rcq->recv_qps.push_back(qp.get());
    if (qp->srq != nullptr) {
      qp->srq->qps.push_back(qp.get());
      MirrorSrqCredits(qp.get());
    }
  }
  ctx->session->registry.AddQp(qpn, qp.get());
  *out = qp.release();
  return 0;
}

// RTR of a QP rdma_cm connects (cmtable::TakeUnnamedPeer): the peer is named by a posted
// NameQp and the QP awaits it, as after an EINPROGRESS answer. The passive side's peer
// cannot have named it yet (the event thread links it once the peer names this QP and it
// asked); the active side's has, and the first WQE links it (AwaitPeer).
int NameWithoutWaiting(Qp* qp, uint32_t ip, uint32_t dest_qpn) {
  ff::proto::NameQp m{};
  m.qpn = qp->qpx.qp_base.qp_num;
  m.dest_ip = htonl(ip);
  m.dest_qpn = dest_qpn;
  {
    // Awaiting before the router hears of it: the event thread may be told of the peer next.
    std::lock_guard<AdaptiveLock> l(qp->ctx->lock);
    qp->conn.awaited = Connection::AwaitedPeer{true, ip, 0, dest_qpn};
  }
  const int rc = qp->ctx->session->Post(&m, sizeof(m));
  if (rc != 0) {  // the router is gone
    std::lock_guard<AdaptiveLock> l(qp->ctx->lock);
    qp->conn.awaited = Connection::AwaitedPeer{};
  }
  return rc;
}

// RTR of an RC/UC QP: connect to the destination in `attr` through the router (before the
// data-path lock is taken: it is a round trip).
int ConnectAtRtr(Qp* qp, const ibv_qp_attr* attr, std::unique_ptr<PeerLink>* link) {
  const ibv_ah_attr& ah = attr->ah_attr;
  const uint32_t qpn = qp->qpx.qp_base.qp_num;
  uint32_t ip = 0;
  if (ah.is_global) {
    auto parsed = ff::IpFromPodGid(ah.grh.dgid.raw, qp->ctx->session->overlay);
    if (!parsed) {
      LogError("QP 0x%x: the destination GID is no pod's (GID index 0 or 1 of its port)", qpn);
      return EINVAL;
    }
    ip = *parsed;
  } else if (ah.dlid == 0) {
    LogError("QP 0x%x: destination has neither a GID nor a LID", qpn);
    return EINVAL;
  }
  if (ip != 0 && cmtable::TakeUnnamedPeer(qp->ctx->session, ip, attr->dest_qp_num))
    return NameWithoutWaiting(qp, ip, attr->dest_qp_num);
  const int rc = ConnectLink(qp, ip, ah.dlid, attr->dest_qp_num, false, link);
  if (rc == EINPROGRESS) {
    // The peer has not named this QP yet (it may reach RTR later): RTR succeeds, as on a
    // real fabric, and the first WQE asks again (AwaitPeer).
    qp->conn.awaited =
        Connection::AwaitedPeer{true, ip, ip != 0 ? uint16_t{0} : ah.dlid, attr->dest_qp_num};
    return 0;
  }
  if (rc != 0) {
    // What the router's refusals mean (ENOSPC comes only from that quota).
    const char* hint =
        rc == ENOSPC ? " (the pod holds as many connections to other nodes as "
                       "its router allows: --max-proxies-per-pod)"
        : rc == EMFILE
            ? " (out of descriptors: the pod's --max-fds-per-pod, or the router's own limit)"
            : "";
    const std::string where = ip != 0 ? ff::FormatIpv4(ip) : "LID " + std::to_string(ah.dlid);
    LogError("QP 0x%x: cannot connect to QP 0x%x at %s: %s%s", qpn, attr->dest_qp_num,
             where.c_str(), std::strerror(rc), hint);
  }
  return rc;
}

int CheckModify(const Qp* qp, const ibv_qp_attr* attr, int mask) {
  const ibv_qp_state cur = qp->qpx.qp_base.state;
  const ibv_qp_state next = (mask & IBV_QP_STATE) ? attr->qp_state : cur;
  if (!TransitionAllowed(cur, next)) return EINVAL;
  const int required = (mask & IBV_QP_STATE) ? RequiredMask(qp->kind, cur, next) : 0;
  if ((mask & required) != required) return EINVAL;
  if ((mask & IBV_QP_PORT) && attr->port_num != 1) return EINVAL;
  if ((mask & IBV_QP_PKEY_INDEX) && attr->pkey_index != 0) return EINVAL;  // one P_Key
  if ((mask & IBV_QP_PATH_MTU) && (attr->path_mtu < IBV_MTU_256 || attr->path_mtu > IBV_MTU_4096))
    return EINVAL;
  if ((mask & IBV_QP_AV) && attr->ah_attr.is_global && attr->ah_attr.grh.sgid_index >= 2)
    return EINVAL;  // past the GID table
  if ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && attr->max_dest_rd_atomic > ff::kMaxRdAtomic)
    return EINVAL;
  if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && attr->max_rd_atomic > ff::kMaxRdAtomic) return EINVAL;
  return 0;
}

// Applies a checked modification under the lock. true when the QP went back to RESET from
// a connected state (the caller disconnects it).
bool ApplyModify(Qp* qp, const ibv_qp_attr* attr, int mask, std::unique_ptr<PeerLink> link) {
  ibv_qp& q = qp->qpx.qp_base;
  const ibv_qp_state cur = q.state;
  std::lock_guard<AdaptiveLock> l(qp->ctx->lock);
  ApplyAttr(qp, attr, mask);
  if (link) qp->conn.link = std::move(link);  // only RTR makes a new one; later transitions keep it
  if (!(mask & IBV_QP_STATE)) return false;
  const ibv_qp_state next = attr->qp_state;
  bool disconnect = false;
  if (next == IBV_QPS_ERR && cur != IBV_QPS_ERR) {
    MoveToError(qp, IBV_WC_WR_FLUSH_ERR);
  } else if (next == IBV_QPS_RESET) {
    ResetQueues(qp);
    disconnect = cur != IBV_QPS_RESET;
  }
  q.state = next;
  qp->attr.qp_state = next;
  return disconnect;
}

void Disconnect(Qp* qp) {
  ff::proto::DisconnectQp m{};
  m.id = qp->qpx.qp_base.qp_num;
  qp->ctx->session->SimpleCall(&m, sizeof(m));
  std::lock_guard<AdaptiveLock> l(qp->ctx->lock);
  qp->conn.Forget();
}

int ModifyQp(Qp* qp, ibv_qp_attr* attr, int mask) {
  if (const int rc = CheckModify(qp, attr, mask)) return rc;
  // A QP the router refused (kQpRefused) has nothing there to bring up again.
  if ((mask & IBV_QP_STATE) && attr->qp_state != IBV_QPS_RESET && attr->qp_state != IBV_QPS_ERR &&
      qp->conn.refused())
    return ENOENT;
  const ibv_qp_state cur = qp->qpx.qp_base.state;
  std::unique_ptr<PeerLink> link;
  if ((mask & IBV_QP_STATE) && cur == IBV_QPS_INIT && attr->qp_state == IBV_QPS_RTR &&
      !qp->kind->datagram) {
    if (const int rc = ConnectAtRtr(qp, attr, &link)) return rc;
  }
  if (ApplyModify(qp, attr, mask, std::move(link))) Disconnect(qp);
  return 0;
}

int DestroyQp(Qp* qp) {
  Context* ctx = qp->ctx;
  const uint32_t qpn = qp->qpx.qp_base.qp_num;
  // What the poll held back (answers to peers on other nodes) goes before the QP does: a
  // program that destroys its QPs and exits right after its last receive still acknowledged it.
  FlushDirectAnswers(ctx->session);
  ctx->session->registry.RemoveQp(qpn);
  DropAsyncEvents(ctx, &qp->qpx.qp_base);
  {
    std::lock_guard<AdaptiveLock> l(ctx->lock);
    auto drop = [qp](std::vector<Qp*>& v) {
      v.erase(std::remove(v.begin(), v.end(), qp), v.end());
    };
    drop(ctx->qps);
    drop(ctx->pending);
    drop(qp->rcq->recv_qps);
    if (ctx->warm_rq == &qp->inbound.rq) ctx->warm_rq = nullptr;
    if (qp->srq != nullptr) drop(qp->srq->qps);
    // Under the lock: a direct connection's answers find the QP through its link's channel
    // only while they hold this lock (datapath/link_direct.cc).
    qp->conn.link.reset();
  }
  // Posted: the router cannot refuse to destroy a QP of this process, and nothing in its
  // answer would change what the program is told (ibv_destroy_qp succeeds). A router that
  // is gone has released the QP already.
  ff::proto::DestroyQp m{};
  m.id = qpn;
  uint64_t served_at = 0;
  ctx->session->Post(&m, sizeof(m), nullptr, 0, &served_at);
  const bool spare = !qp->kind->datagram;
  UniqueFd seg_fd = std::move(qp->inbound.seg_fd);
  ff::Mapping seg = std::move(qp->inbound.seg);
  pthread_mutex_destroy(&qp->qpx.qp_base.mutex);
  pthread_cond_destroy(&qp->qpx.qp_base.cond);
  delete qp;
  if (spare) KeepSpare(ctx->session, std::move(seg_fd), std::move(seg), served_at);
  return 0;
}

}  // namespace

// The ibv_wr_* operations a QP of each type can post, as rxe and mlx5 check them at create:
// asking for another is EOPNOTSUPP there, not an error completion later. TSO is a raw
// packet QP's, which freeflow0 has none of.
uint64_t SendOpsOf(ibv_qp_type type) {
  constexpr uint64_t kUd = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
  constexpr uint64_t kUc = kUd | IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
                           IBV_QP_EX_WITH_LOCAL_INV | IBV_QP_EX_WITH_BIND_MW |
                           IBV_QP_EX_WITH_SEND_WITH_INV;
  constexpr uint64_t kRc = kUc | IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
                           IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_ATOMIC_WRITE;
  switch (type) {
    case IBV_QPT_RC:
      return kRc;
    case IBV_QPT_UC:
      return kUc;
    case IBV_QPT_UD:
      return kUd;
    default:
      return 0;
  }
}

ibv_qp* CreateQpEx(ibv_context* context, ibv_qp_init_attr_ex* attr) {
  constexpr uint32_t kKnown =
      IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS | IBV_QP_INIT_ATTR_CREATE_FLAGS;
  int rc = 0;
  if (attr != nullptr && (attr->qp_type == IBV_QPT_XRC_SEND || attr->qp_type == IBV_QPT_XRC_RECV)) {
    LogError("ibv_create_qp_ex: XRC QPs are not supported by this device");
    rc = EOPNOTSUPP;
  } else if (context == nullptr || attr == nullptr || !(attr->comp_mask & IBV_QP_INIT_ATTR_PD)) {
    rc = EINVAL;
  }
  if (rc == 0 && (attr->comp_mask & ~kKnown) != 0) rc = EOPNOTSUPP;
  // Create flags (scatter FCS, CVLAN stripping, source-QPN, ...) are raw Ethernet and offload
  // features freeflow0 has none of; none asked is what every program not using them passes.
  if (rc == 0 && (attr->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) != 0 && attr->create_flags != 0)
    rc = EOPNOTSUPP;
  if (rc == 0 && (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) != 0 &&
      (attr->send_ops_flags & ~SendOpsOf(attr->qp_type)) != 0) {
    LogDebug(
        "ibv_create_qp_ex: send_ops_flags 0x%llx asks for operations a QP of type %d cannot "
        "post",
        static_cast<unsigned long long>(attr->send_ops_flags), attr->qp_type);
    rc = EOPNOTSUPP;
  }
  Qp* qp = nullptr;
  if (rc == 0) rc = Guarded([&] { return CreateQp(ToCtx(context), attr->pd, attr, &qp); });
  return ObjectOrNull(rc, rc == 0 ? &qp->qpx.qp_base : nullptr);
}

}  // namespace ff::verbs

using namespace ff::verbs;

extern "C" {

FFV_EXPORT ibv_qp* ibv_create_qp(ibv_pd* pd, ibv_qp_init_attr* attr) {
  if (pd == nullptr || attr == nullptr) return ObjectOrNull<ibv_qp>(EINVAL, nullptr);
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
  ibv_qp* qp = CreateQpEx(pd->context, &ex);
  if (qp != nullptr) attr->cap = ex.cap;
  return qp;
}

FFV_EXPORT int ibv_modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int mask) {
  if (qp == nullptr || attr == nullptr) return EINVAL;
  return Guarded([&] { return ModifyQp(ToQp(qp), attr, mask); });
}

FFV_EXPORT int ibv_query_qp(ibv_qp* ibqp, ibv_qp_attr* attr, int, ibv_qp_init_attr* init) {
  if (ibqp == nullptr || attr == nullptr) return EINVAL;
  Qp* qp = ToQp(ibqp);
  std::lock_guard<AdaptiveLock> l(qp->ctx->lock);
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
    init->qp_type = qp->kind->type;
    init->sq_sig_all = qp->sq_sig_all ? 1 : 0;
  }
  return 0;
}

FFV_EXPORT int ibv_destroy_qp(ibv_qp* qp) {
  if (qp == nullptr) return EINVAL;
  return Guarded([&] { return DestroyQp(ToQp(qp)); });
}

}  // extern "C"
