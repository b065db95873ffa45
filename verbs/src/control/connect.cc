// Connecting a QP to its peer through the router, and the peer's shared memory that comes
// with it: its QP segment (or the router's proxy segment), its notify words, its MR table
// and, on first use, its registered regions. This is where a link's operations are chosen.
#include <arpa/inet.h>

#include <algorithm>

#include "datapath/link.h"
#include "datapath/send_queue.h"
#include "direct/direct.h"
#include "session/session.h"

namespace ff::verbs {
namespace {

// Who is at the other end, as the router's connect answer names it.
void SetPeerIdentity(PeerLink* link, const ff::proto::ConnectReply& c) {
  link->peer_ctx_id = c.peer_ctx_id;
  link->peer_qpn = c.peer_qpn;
  link->peer_ip = ntohl(c.peer_ip);
  link->peer_lid = c.peer_lid;
  link->qp_type = c.peer_qp_type;
}

// Maps the segment we produce into (`num_rings` rings of c.ring_bytes) and checks it.
int MapRingSegment(PeerLink* link, const ff::proto::ConnectReply& c, uint32_t num_rings,
                   const UniqueFd& fd) {
  const size_t bytes = ff::QpSegmentBytes(num_rings, c.ring_bytes);
  if (ff::MapPeerSegment(fd.get(), bytes, true, &link->seg) != 0) return EPROTO;
  link->hdr = link->seg.as<ff::QpSegmentHeader>();
  return link->hdr->magic == ff::kQpSegMagic ? 0 : EPROTO;
}

// `p` was linked to just now: first among the recent peers.
void Remember(Context* ctx, const std::shared_ptr<PeerCtx>& p) {
  auto& recent = ctx->recent_peers;
  const auto it = std::find(recent.begin(), recent.end(), p);
  if (it != recent.end()) recent.erase(it);
  recent.push_front(p);
  if (recent.size() > ff::kRecentPeers) recent.pop_back();
}

// The peer process as all our links to it share it; mapped on the first connect to it.
std::shared_ptr<PeerCtx> GetPeerCtx(Context* ctx, uint32_t id, const UniqueFd& notify_fd,
                                    const UniqueFd& table_fd) {
  auto it = ctx->peers.find(id);
  if (it != ctx->peers.end()) {
    if (auto p = it->second.lock()) {
      Remember(ctx, p);
      return p;
    }
  }
  auto p = std::make_shared<PeerCtx>();
  p->ctx_id = id;
  if (ff::MapPeerSegment(notify_fd.get(), ff::kNotifySegmentBytes, true, &p->notify) != 0 ||
      ff::MapRouterTable(table_fd.get(), ff::kMrTableBytes, &p->mr_table) != 0) {
    return nullptr;
  }
  ctx->peers[id] = p;
  Remember(ctx, p);
  return p;
}

// The peer lives on another node: the router gave us its proxy segment and the doorbell
// that wakes it.
int RouterLink(const ff::proto::ConnectReply& c, UniqueFd* fds, PeerLink* link) {
  if (const int rc = MapRingSegment(link, c, ff::kProxyRings, fds[0])) return rc;
  link->producer.Attach(ff::QpRing(link->seg.get(), ff::kProxyRequestRing, c.ring_bytes),
                        c.ring_bytes);
  link->responses.Attach(ff::QpRing(link->seg.get(), ff::kProxyResponseRing, c.ring_bytes),
                         c.ring_bytes);
  link->notify = &link->hdr->doorbell;
  link->notify_fd = std::move(fds[1]);
  link->ops = &kRouterOps;
  return 0;
}

// A peer process on this node: fds are its QP segment, notify segment, MR table, then
// its CQ's channel wake socket (when it has one) and its SRQ segment (when it has one).
int SameNodeLink(Context* ctx, const ff::proto::ConnectReply& c, UniqueFd* fds, PeerLink* link) {
  if (const int rc = MapRingSegment(link, c, c.num_rings, fds[0])) return rc;
  int next = 3;
  if (c.notify_slot != ff::proto::kNoId) link->notify_fd = std::move(fds[next++]);
  // On an SRQ too we claim on the QP's header; its owner claims each message on the SRQ
  // when it takes it (shm_layout.h, SrqSegment). A router hands no SRQ (has_srq is 0).
  if (c.has_srq) return EPROTO;
  link->credits = &link->hdr->credits;
  link->pctx = GetPeerCtx(ctx, c.peer_ctx_id, fds[1], fds[2]);
  if (link->pctx == nullptr) return EPROTO;
  if (c.notify_slot != ff::proto::kNoId)
    link->notify = link->pctx->notify.as<ff::NotifySlot>() + c.notify_slot;
  if (c.flags & ff::proto::kConnectOwnRing) {  // a UD destination: a ring of our own
    const UniqueFd& ring = fds[next];
    if (ff::MapPeerSegment(ring.get(), ff::UdRingBytes(c.ring_bytes), true, &link->own_ring) != 0)
      return EPROTO;
    link->producer.Attach(link->own_ring.as<ff::RingHeader>(), c.ring_bytes);
  } else {
    link->producer.Attach(ff::QpRing(link->seg.get(), c.ring_index, c.ring_bytes), c.ring_bytes);
  }
  link->ops = &kSameNodeOps;
  return 0;
}

}  // namespace

int ConnectLink(Qp* qp, uint32_t dest_ip, uint16_t dest_lid, uint32_t dest_qpn, bool ud,
                std::unique_ptr<PeerLink>* out, bool again) {
  Context* ctx = qp->ctx;
  ff::proto::ConnectQp m{};
  m.h.op = ud ? ff::proto::Op::kResolveUd : ff::proto::Op::kConnectQp;
  m.qpn = qp->qpx.qp_base.qp_num;
  m.dest_ip = htonl(dest_ip);
  m.dest_lid = dest_lid;
  m.dest_qpn = dest_qpn;
  m.flags = ud && again ? ff::proto::kResolveAgain : 0;
  ff::proto::Response r{};
  UniqueFd fds[5];
  int got = 0;
  // From the request to the link made: an answer naming a direct connection that another
  // thread's connect just made finds it in place.
  std::lock_guard<std::mutex> serial(ctx->session->connect_mu);
  int rc = ctx->session->Call(&m, sizeof(m), nullptr, 0, &r, fds, 5, &got);
  if (rc != 0) return rc;
  const ff::proto::ConnectReply& c = r.u.connect;
  if (got != ff::proto::ConnectReplyFds(c)) return EPROTO;
  auto link = std::make_unique<PeerLink>();
  SetPeerIdentity(link.get(), c);
  if (c.flags & ff::proto::kConnectDirect) {
    rc = LinkDirect(qp, c, link.get());
    if (rc == 0) link->ops = &kDirectOps;
  } else if (c.flags & ff::proto::kConnectRemote) {
    rc = RouterLink(c, fds, link.get());
  } else {
    rc = SameNodeLink(ctx, c, fds, link.get());
  }
  if (rc != 0) return rc;
  if (const std::shared_ptr<TrafficLedger>& ledger = ctx->session->traffic)
    link->traffic = ledger->Take(link->peer_ip, link->ops->placement);
  *out = std::move(link);
  return 0;
}

namespace {

// How long a requester retries a peer that does not answer: timeout x (retry_cnt + 1), as a
// real RC QP counts it (4.096 us << timeout each), but never less than kConsentMinWaitNs;
// timeout 0 waits forever.
uint64_t PeerWaitNs(const Qp* qp) {
  const uint32_t t = qp->attr.timeout;
  if (t == 0) return UINT64_MAX;
  const uint64_t each = uint64_t{4096} << std::min(t, 31u);
  return std::max<uint64_t>(ff::kConsentMinWaitNs, each * (qp->attr.retry_cnt + 1u));
}

}  // namespace

uint64_t RetryExhaustedAt(const Qp* qp, uint64_t now_ns) {
  const uint32_t t = qp->attr.timeout;
  if (t == 0) return now_ns + ff::kPeerErrorMaxDelayNs;
  const uint64_t each = uint64_t{4096} << std::min(t, 31u);
  return now_ns + std::min(ff::kPeerErrorMaxDelayNs, each * (qp->attr.retry_cnt + 1u));
}

Exec AwaitPeer(Qp* qp, ibv_wc_status* st) {
  Connection::AwaitedPeer& a = qp->conn.awaited;
  const uint64_t now = ff::MonotonicNs();
  if (a.deadline_ns == 0) {
    const uint64_t wait = PeerWaitNs(qp);
    a.deadline_ns = wait == UINT64_MAX ? UINT64_MAX : now + wait;
  }
  if (now < a.next_ns) return Exec::kBlocked;
  const int rc = TryAwaitedLink(qp);
  if (rc == 0) return Exec::kDone;
  if (rc == EINPROGRESS && now < a.deadline_ns) {
    a.backoff_ns = std::clamp(a.backoff_ns * 2, ff::kConsentRetryNs, ff::kConsentMaxRetryNs);
    a.next_ns = now + a.backoff_ns;
    return Exec::kBlocked;
  }
  a.waiting = false;
  *st = IBV_WC_RETRY_EXC_ERR;
  if (rc == EINPROGRESS) {
    LogError("QP 0x%x: QP 0x%x did not name this QP in time: the connection failed",
             qp->qpx.qp_base.qp_num, a.qpn);
    return Exec::kDone;
  }
  // Refused at once: the peer QP is gone (its program may have finished without ever needing
  // this QP's answer, as ibv_srq_pingpong's client does). A real requester would retry all
  // the same first, and say nothing.
  LogDebug("QP 0x%x: the connection to QP 0x%x was refused: %s", qp->qpx.qp_base.qp_num, a.qpn,
           std::strerror(rc));
  HoldPeerError(qp);
  return Exec::kDone;
}

int TryAwaitedLink(Qp* qp) {
  Connection::AwaitedPeer& a = qp->conn.awaited;
  std::unique_ptr<PeerLink> link;
  if (const int rc = ConnectLink(qp, a.ip, a.lid, a.qpn, false, &link)) return rc;
  qp->conn.link = std::move(link);
  a.waiting = false;
  return 0;
}

PeerLink* UdLink(Qp* qp, const SendWqe& w) {
  Connection& c = qp->conn;
  const uint64_t key =
      (static_cast<uint64_t>(w.dest_ip != 0 ? w.dest_ip : w.dest_lid) << 32) | w.remote_qpn;
  auto it = c.ud_links.find(key);
  if (it != c.ud_links.end()) {
    // A direct connection that ended took the link with it: ask for a new one.
    if (!it->second->dead) return it->second.get();
    c.ud_links.erase(it);
  }
  // A destination that could not be linked just now is not asked for again at once: a
  // router round trip per datagram (across nodes, one to the peer router too) would stall
  // every QP of the context, where a NIC drops the datagram and goes on.
  auto bad = c.ud_unreachable.find(key);
  if (bad != c.ud_unreachable.end() && ff::MonotonicNs() < bad->second.next_ns) return nullptr;
  std::unique_ptr<PeerLink> link;
  const bool again = bad != c.ud_unreachable.end();
  // A link that is dead at once is a direct connection whose dial failed: unreachable too.
  if (ConnectLink(qp, w.dest_ip, w.dest_lid, w.remote_qpn, true, &link, again) != 0 || link->dead) {
    const uint64_t now = ff::MonotonicNs();
    if (bad == c.ud_unreachable.end()) {
      if (c.ud_unreachable.size() >= ff::kUdUnreachableKept)
        std::erase_if(c.ud_unreachable, [now](const auto& e) { return e.second.next_ns <= now; });
      if (c.ud_unreachable.size() >= ff::kUdUnreachableKept) c.ud_unreachable.clear();
      c.ud_unreachable[key] = {now + ff::kUdUnreachableRetryNs, ff::kUdUnreachableRetryNs};
    } else {
      Connection::Unreachable& u = bad->second;
      u.backoff_ns = std::min(u.backoff_ns * 2, ff::kUdUnreachableMaxRetryNs);
      u.next_ns = now + u.backoff_ns;
    }
    return nullptr;
  }
  if (bad != c.ud_unreachable.end()) c.ud_unreachable.erase(bad);
  PeerLink* raw = link.get();
  c.ud_links.emplace(key, std::move(link));
  return raw;
}

// Asks the router for the peer's region `region_id` and maps it with the rights it grants.
int MapPeerRegion(Qp* qp, uint32_t region_id, PeerRegionMap* out) {
  ff::proto::GetRegion m{};
  m.qpn = qp->qpx.qp_base.qp_num;
  m.region_id = region_id;
  ff::proto::Response r{};
  UniqueFd fd;
  int got = 0;
  const int rc = qp->ctx->session->Call(&m, sizeof(m), nullptr, 0, &r, &fd, 1, &got);
  if (rc != 0) return rc;
  const uint64_t size = r.u.region.size;
  out->writable = r.u.region.writable != 0;
  if (got != 1 || size == 0 || ff::MapPeerSegment(fd.get(), size, out->writable, &out->map) != 0)
    return EPROTO;
  return 0;
}

int PeerRegion(Qp* qp, PeerLink* link, uint32_t region_id, uint32_t need, Mapping** out) {
  PeerCtx* p = link->pctx.get();
  const bool writes = (need & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) != 0;
  if (p->last_region == region_id) {
    if (writes && !p->last_mapping->writable) return EACCES;
    *out = &p->last_mapping->map;
    return 0;
  }
  auto it = p->regions.find(region_id);
  if (it == p->regions.end()) {
    PeerRegionMap map;
    if (const int rc = MapPeerRegion(qp, region_id, &map)) return rc;
    it = p->regions.emplace(region_id, std::move(map)).first;
  }
  p->last_region = region_id;
  p->last_mapping = &it->second;
  if (writes && !it->second.writable) return EACCES;
  *out = &it->second.map;
  return 0;
}

}  // namespace ff::verbs
