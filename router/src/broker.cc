#include "broker.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <set>
#include <vector>

#include "freeflow/ipv4.h"
#include "freeflow/target_ops.h"

namespace ff::router {
namespace {

// One request being answered at once: the pod, the message and its descriptors, the reply.
struct Request {
  Broker::Parts& b;
  Pod& pod;
  const char* msg;
  UniqueFd* fds;
  int nfds;
  bool posted;  // no answer goes back
  proto::Response reply{};
  std::vector<int> reply_fds;
};
// Returns 0 or a positive errno value for the answer's status.
using Handler = int (*)(Request& q);

// Descriptors a session keeps after HELLO: notify segment, event socket, wake eventfd, and
// the two of its MR table (its socket was charged when it connected).
constexpr uint64_t kHelloFds = 5;

// Adds a pod object under the pod's own id, within the per-connection limit and the pod's
// quotas (one object, and `fds` descriptors the router keeps).
template <typename Map, typename V>
int AddObject(Request& q, Map& objects, uint32_t id, V&& value, uint64_t fds) {
  if (objects.size() >= kMaxObjectsPerPod) return ENOSPC;
  if (objects.count(id)) return EEXIST;
  if (const int rc = q.b.quotas.Take(q.pod.id, {{Quota::kObjects, 1}, {Quota::kFds, fds}}))
    return rc;
  objects.emplace(id, std::forward<V>(value));
  return 0;
}

template <typename Map>
int RemoveObject(Request& q, Map& objects, uint32_t id, uint64_t fds) {
  if (!objects.erase(id)) return ENOENT;
  q.b.quotas.Give(q.pod.id, {{Quota::kObjects, 1}, {Quota::kFds, fds}});
  return 0;
}

bool ValidRange(uint64_t offset, uint64_t length, uint64_t size) {
  return offset <= size && length <= size - offset;
}

int CreateChannel(Request& q) {
  if (!IsWakeSocket(q.fds[0].get())) return EINVAL;
  return AddObject(q, q.pod.channels, proto::As<proto::CreateChannel>(q.msg).id,
                   std::move(q.fds[0]), 1);
}

int DestroyChannel(Request& q) {
  return RemoveObject(q, q.pod.channels, proto::As<proto::DestroyChannel>(q.msg).id, 1);
}

int CreateCq(Request& q) {
  const auto m = proto::As<proto::CreateCq>(q.msg);
  if (m.notify_slot != proto::kNoId &&
      (m.notify_slot >= proto::kWakeSlot || !q.pod.channels.count(m.chan_id)))
    return EINVAL;
  return AddObject(q, q.pod.cqs, m.cq_id, Cq{m.notify_slot, m.chan_id}, 0);
}

int DestroyCq(Request& q) {
  return RemoveObject(q, q.pod.cqs, proto::As<proto::DestroyCq>(q.msg).id, 0);
}

int CreateSrq(Request& q) {
  if (!SealedAtLeast(q.fds[0].get(), sizeof(SrqSegment))) return EINVAL;
  return AddObject(q, q.pod.srqs, proto::As<proto::CreateSrq>(q.msg).id, std::move(q.fds[0]), 1);
}

int DestroySrq(Request& q) {
  return RemoveObject(q, q.pod.srqs, proto::As<proto::DestroySrq>(q.msg).id, 1);
}

// The descriptors the router may keep for a QP of `kind` (its `fds` quota): its segment, and
// for a datagram QP the memfd of each sender's own ring (NewUdRing). `kind` nullptr: a type
// CheckQp refuses.
uint32_t QpFds(const QpKind* kind, uint32_t num_rings) {
  return 1 + (kind != nullptr && kind->datagram ? num_rings : 0);
}

// Tops the pod's granted QP numbers up to kQpnGrant (proto::CreateQpReply). A number holds
// no quota: the create that uses it takes the pod's, as any other does, so what one session
// was granted never refuses another session or another resource. Numbers are granted only
// while the pod is far from its limits, so that a posted create is seldom refused.
void Grant(Request& q) {
  std::vector<uint32_t>& g = q.pod.qpn_grants;
  const auto room = [&](Quota k) {
    return q.b.quotas.used(q.pod.who.ip, k) + 2 * proto::kQpnGrant <= q.b.quotas.limit(k);
  };
  if (!room(Quota::kQps) || !room(Quota::kFds)) return;
  while (g.size() < proto::kQpnGrant && q.pod.qps.size() + g.size() < kMaxQpsPerPod)
    g.push_back(q.b.tables.ReserveQpn());
}

// What CreateQp checks of the request itself.
int CheckQp(const Request& q, const proto::CreateQp& m) {
  if (q.pod.qps.size() >= kMaxQpsPerPod) return ENOSPC;
  if (QpKindOf(m.qp_type) == nullptr) return EINVAL;
  if (m.num_rings == 0 || m.num_rings > kMaxRingsPerQp || m.ring_bytes < kMinRingBytes ||
      m.ring_bytes > kMaxRingBytes || (m.ring_bytes & (m.ring_bytes - 1)) != 0)
    return EINVAL;
  if (!SealedAtLeast(q.fds[0].get(), QpSegmentBytes(m.num_rings, m.ring_bytes))) return EINVAL;
  if (m.srq_id != proto::kNoId && !q.pod.srqs.count(m.srq_id)) return EINVAL;
  if (!q.pod.cqs.count(m.recv_cq_id) || !q.pod.cqs.count(m.send_cq_id)) return EINVAL;
  return 0;
}

// Checks a create under granted number m.qpn (of `kind`, m.qp_type's) and takes its quota.
// The number is used up whatever the outcome. A posted create the router refuses (the pod
// reached a quota meanwhile, or it speaks the protocol itself) is logged, and the process
// hears kQpRefused for the number: the QP it believes it has fails (QP_FATAL) instead of
// waiting.
int TakeGranted(Request& q, const proto::CreateQp& m, const QpKind* kind, uint32_t fds) {
  auto it = std::find(q.pod.qpn_grants.begin(), q.pod.qpn_grants.end(), m.qpn);
  if (it == q.pod.qpn_grants.end()) return ENOENT;  // not this session's to use
  q.pod.qpn_grants.erase(it);
  // A known kind that may not be posted is refused here; an unknown one by CheckQp.
  int rc = kind != nullptr && !kind->posted_create ? EINVAL : CheckQp(q, m);
  if (rc == 0) rc = q.b.quotas.Take(q.pod.id, {{Quota::kQps, 1}, {Quota::kFds, fds}});
  if (rc == 0) return 0;
  q.b.tables.ReleaseQpn(m.qpn);
  if (q.posted) {
    spdlog::info("client {}: posted create of QP {:#x} refused: {}", q.pod.id, m.qpn,
                 std::strerror(rc));
    q.b.sessions.Notify(q.pod.id, proto::EventType::kQpRefused, m.qpn);
  }
  return rc;
}

int NewQp(Request& q) {
  const auto m = proto::As<proto::CreateQp>(q.msg);
  const QpKind* kind = QpKindOf(m.qp_type);  // nullptr: refused below (CheckQp)
  const uint32_t fds = QpFds(kind, m.num_rings);
  if (m.qpn != 0) {
    if (const int rc = TakeGranted(q, m, kind, fds)) return rc;
  } else if (q.posted) {
    return EINVAL;  // only a granted number may be posted: nobody would learn this one
  } else {
    if (const int rc = CheckQp(q, m)) return rc;
    if (const int rc = q.b.quotas.Take(q.pod.id, {{Quota::kQps, 1}, {Quota::kFds, fds}})) return rc;
  }
  auto qp = std::make_unique<Qp>();
  qp->kind = kind;
  qp->owner = q.pod.id;
  qp->seg = std::move(q.fds[0]);
  qp->num_rings = m.num_rings;
  qp->ring_bytes = m.ring_bytes;
  qp->srq_id = m.srq_id;
  qp->recv_cq_id = m.recv_cq_id;
  qp->send_cq_id = m.send_cq_id;
  qp->producers.assign(m.num_rings, Producer{});
  const uint32_t qpn = q.b.tables.AddQp(std::move(qp), m.qpn).qpn;
  q.pod.qps.insert(qpn);
  q.reply.u.create_qp.qpn = qpn;
  return 0;
}

// An answer, refusal or not, lists the numbers granted now (see proto::CreateQpReply).
int CreateQp(Request& q) {
  const int rc = NewQp(q);
  if (q.posted) return rc;
  if (rc == 0) Grant(q);
  const std::vector<uint32_t>& g = q.pod.qpn_grants;
  proto::CreateQpReply& r = q.reply.u.create_qp;
  r.grant_count = static_cast<uint32_t>(g.size());
  std::copy(g.begin(), g.end(), r.grant);
  return rc;
}

// Takes every ring of `qp` back from the QPs that produce into it; local RC/UC producers
// hear `gone`, UD senders that their link is lost.
void ReleaseProducers(Broker::Parts& b, Qp& qp, bool died) {
  if (qp.kind->datagram) {
    for (size_t i = 0; i < qp.producers.size(); ++i) b.executor.LoseUdRing(qp, i, died);
    return;
  }
  const proto::EventType gone = died ? proto::EventType::kPeerGone : proto::EventType::kPeerClosed;
  const std::vector<Producer> producers = qp.producers;
  for (const Producer& p : producers) {
    if (p.kind == Producer::Kind::kRemote) b.executor.ReleaseSender(p.id, died);
    if (p.kind != Producer::Kind::kLocalQp) continue;
    Qp* from = b.tables.FindQp(p.id);
    if (from == nullptr) continue;
    from->produces_into.erase(qp.qpn);
    b.sessions.Notify(from->owner, gone, from->qpn);
  }
  for (size_t i = 0; i < qp.producers.size(); ++i) qp.FreeRing(i);
}

// Releases `qp`: its links to other nodes and the rings it and others produce into. Its
// connected peers hear kPeerGone (its process died) or kPeerClosed (it was destroyed).
void ReleaseQp(Broker::Parts& b, Qp& qp, bool died) {
  const proto::EventType gone = died ? proto::EventType::kPeerGone : proto::EventType::kPeerClosed;
  b.forwarder.DropQp(qp.qpn, died);
  ReleaseProducers(b, qp, died);
  for (uint32_t dest : b.tables.Unlink(qp)) {
    Qp* d = b.tables.FindQp(dest);
    if (d != nullptr && !d->kind->datagram) b.sessions.Notify(d->owner, gone, dest);
  }
}

int DestroyQp(Request& q) {
  const uint32_t qpn = proto::As<proto::DestroyQp>(q.msg).id;
  Qp* qp = q.b.tables.FindOwnedQp(q.pod, qpn);
  if (qp == nullptr) return ENOENT;
  ReleaseQp(q.b, *qp, false);
  const uint32_t fds = QpFds(qp->kind, qp->num_rings);
  q.pod.qps.erase(qpn);
  q.b.tables.EraseQp(qpn);
  q.pod.windows.QpGone(q.pod.mr, qpn);
  q.b.quotas.Give(q.pod.id, {{Quota::kQps, 1}, {Quota::kFds, fds}});
  return 0;
}

// Back at RESET: the QP forgets its peer, in both directions. The peer that produced into
// it named the old connection and loses its ring (it hears kPeerClosed).
void Disconnect(Broker::Parts& b, Qp& qp) {
  b.forwarder.DropQp(qp.qpn, false);
  b.tables.Unlink(qp);
  if (!qp.kind->datagram) ReleaseProducers(b, qp, false);
  qp.named = Qp::Named{};
  qp.asked = false;
}

int DisconnectQp(Request& q) {
  const uint32_t qpn = proto::As<proto::DisconnectQp>(q.msg).id;
  Qp* qp = q.b.tables.FindOwnedQp(q.pod, qpn);
  if (qp == nullptr) return ENOENT;
  Disconnect(q.b, *qp);
  return 0;
}

// A registration naming a region the router has not seen brings its memfd, which must be at
// least as large as the library claims.
int AcceptRegion(Request& q, bool is_new, uint32_t region_id, uint64_t region_size) {
  if (!is_new) return q.nfds == 0 ? 0 : EINVAL;
  if (q.nfds != 1 || q.pod.regions.count(region_id) || q.pod.regions.size() >= kMaxObjectsPerPod)
    return EINVAL;
  if (!SealedAtLeast(q.fds[0].get(), region_size)) return EINVAL;
  if (const int rc = q.b.quotas.Take(q.pod.id, {{Quota::kRegions, 1}, {Quota::kFds, 1}})) return rc;
  Region& r = q.pod.regions[region_id];
  r.fd = std::move(q.fds[0]);
  r.size = region_size;
  return 0;
}

// The owner no longer uses region `id`: its memfd, and the router's mapping if it made one.
void ReleaseRegion(Request& q, uint32_t id) {
  auto it = q.pod.regions.find(id);
  if (it == q.pod.regions.end()) return;
  const uint64_t mapped = it->second.map.get() != nullptr ? it->second.map.size() : 0;
  q.pod.regions.erase(it);
  q.b.quotas.Give(q.pod.id,
                  {{Quota::kRegions, 1}, {Quota::kFds, 1}, {Quota::kMappedBytes, mapped}});
}

// Counts a registration with `access` in (delta 1) or out of (-1) region `id`, if it exists.
// A registration with IBV_ACCESS_MW_BIND counts as the windows bound over it may grant.
void CountMr(Pod& pod, uint32_t id, uint32_t access, int delta) {
  auto region = pod.regions.find(id);
  if (region == pod.regions.end() || !RegistrationReachable(access)) return;
  region->second.remote_mrs += static_cast<uint32_t>(delta);
  if (RegistrationWritable(access)) region->second.writable_mrs += static_cast<uint32_t>(delta);
}

// Publishes `entry` within the pod's MR-entry quota.
int AddMrEntry(Request& q, const MrView& entry) {
  if (const int rc = q.b.quotas.Take(q.pod.id, {{Quota::kMrEntries, 1}})) return rc;
  const int rc = q.pod.mr.Add(entry, &q.reply.u.reg_mr.key);
  if (rc != 0) q.b.quotas.Give(q.pod.id, {{Quota::kMrEntries, 1}});
  return rc;
}

// A registration without remote access (or windows) has no region: nobody but its owner
// reaches it.
int RegLocalMr(Request& q, const proto::RegMr& m) {
  if (RegistrationReachable(m.access) || m.new_region || m.region_offset || m.region_size)
    return EINVAL;
  MrView entry{0, m.access, proto::kNoRegion, m.addr, m.length, 0};
  entry.pd = m.pd;
  return AddMrEntry(q, entry);
}

int RegMr(Request& q) {
  const auto m = proto::As<proto::RegMr>(q.msg);
  if (m.length == 0 || m.length > kMaxMrSize) return EINVAL;
  if (m.region_id == proto::kNoRegion) return q.nfds == 0 ? RegLocalMr(q, m) : EINVAL;
  if (!RegistrationReachable(m.access)) return EINVAL;  // memory of its own is never shared
  if (const int rc = AcceptRegion(q, m.new_region != 0, m.region_id, m.region_size)) return rc;
  auto region = q.pod.regions.find(m.region_id);
  if (region == q.pod.regions.end()) return ENOENT;
  if (!ValidRange(m.region_offset, m.length, region->second.size)) return EINVAL;
  MrView entry{0, m.access, m.region_id, m.addr, m.length, m.region_offset};
  entry.pd = m.pd;
  if (const int rc = AddMrEntry(q, entry)) return rc;
  CountMr(q.pod, m.region_id, m.access, 1);
  return 0;
}

int DeregMr(Request& q) {
  const auto m = proto::As<proto::DeregMr>(q.msg);
  MrView v;
  if (!q.pod.mr.Find(m.key, &v) || q.pod.windows.IsWindow(m.key)) return EINVAL;
  if (q.pod.windows.Busy(m.key)) return EBUSY;  // memory windows are bound to it
  uint32_t region = 0;
  if (const int rc = q.pod.mr.Remove(m.key, &region)) return rc;
  CountMr(q.pod, region, v.access, -1);
  q.b.quotas.Give(q.pod.id, {{Quota::kMrEntries, 1}});
  if (m.release && region != proto::kNoRegion) ReleaseRegion(q, region);
  return 0;
}

int MoveMr(Request& q) {
  const auto m = proto::As<proto::MoveMr>(q.msg);
  MrView v;
  if (!q.pod.mr.Find(m.key, &v) || v.region == proto::kNoRegion ||
      m.region_id == proto::kNoRegion || q.pod.windows.IsWindow(m.key))
    return EINVAL;
  if (const int rc = AcceptRegion(q, m.new_region != 0, m.region_id, m.region_size)) return rc;
  auto region = q.pod.regions.find(m.region_id);
  if (region == q.pod.regions.end()) return ENOENT;
  if (!ValidRange(m.region_offset, v.length, region->second.size)) return EINVAL;
  if (const int rc = q.pod.mr.Move(m.key, m.region_id, m.region_offset)) return rc;
  q.pod.windows.FollowMr(q.pod.mr, m.key);
  CountMr(q.pod, v.region, v.access, -1);
  CountMr(q.pod, m.region_id, v.access, 1);
  if (m.release && v.region != m.region_id) ReleaseRegion(q, v.region);
  return 0;
}

// Memory windows (objects/memory_windows.h): each is an MR-table entry, within the pod's MR-entry
// quota.
int AllocMw(Request& q) {
  const auto m = proto::As<proto::AllocMw>(q.msg);
  if (const int rc = q.b.quotas.Take(q.pod.id, {{Quota::kMrEntries, 1}})) return rc;
  const int rc = q.pod.windows.Alloc(q.pod.mr, m.type, m.pd, &q.reply.u.reg_mr.key);
  if (rc != 0) q.b.quotas.Give(q.pod.id, {{Quota::kMrEntries, 1}});
  return rc;
}

int BindMw(Request& q) {
  const auto m = proto::As<proto::BindMw>(q.msg);
  const Qp* qp = m.qpn != 0 ? q.b.tables.FindOwnedQp(q.pod, m.qpn) : nullptr;
  const int rc = q.pod.windows.Bind(q.pod.mr, m, qp != nullptr && qp->kind->Allows(IBV_WR_BIND_MW));
  if (rc != 0) spdlog::debug("client {}: memory window bind refused: {}", q.pod.id, rc);
  return rc;
}

int InvalidateMw(Request& q) {
  const auto m = proto::As<proto::InvalidateMw>(q.msg);
  return q.pod.windows.Invalidate(q.pod.mr, m.key, m.qpn);
}

int DeallocMw(Request& q) {
  const auto m = proto::As<proto::DeallocMw>(q.msg);
  if (const int rc = q.pod.windows.Dealloc(q.pod.mr, m.key)) return rc;
  q.b.quotas.Give(q.pod.id, {{Quota::kMrEntries, 1}});
  return 0;
}

// Answers with region `id` of `owner` for a connected peer, with the rights its
// registrations grant: none (ENOENT), reads only (it must be sealed so), or writes.
int ShareRegion(Request& q, Pod& owner, uint32_t id) {
  auto it = owner.regions.find(id);
  if (it == owner.regions.end() || it->second.remote_mrs == 0) return ENOENT;
  Region& region = it->second;
  const bool sealed = SealedReadOnly(region.fd.get());
  if (region.writable_mrs == 0 && !sealed) {
    spdlog::warn("client {}: region {} grants reads only but is not sealed read-only; not shared",
                 owner.id, id);
    return EACCES;
  }
  q.reply.u.region.size = region.size;
  q.reply.u.region.writable = region.writable_mrs != 0 && !sealed ? 1 : 0;
  q.reply_fds.push_back(region.fd.get());
  return 0;
}

// The memfd of a region of the RC/UC peer QP `qpn` is connected to (with its consent:
// a ring is only ever given to the QP the peer named). UD destinations share no memory.
int GetRegion(Request& q) {
  const auto m = proto::As<proto::GetRegion>(q.msg);
  Qp* self = q.b.tables.FindOwnedQp(q.pod, m.qpn);
  if (self == nullptr) return ENOENT;
  if (self->kind->datagram) return EINVAL;
  for (uint32_t dest : self->produces_into) {
    Qp* d = q.b.tables.FindQp(dest);
    Pod* owner = d != nullptr ? q.b.tables.FindPod(d->owner) : nullptr;
    if (owner != nullptr && d->Consents(q.pod.who.ip, self->qpn))
      return ShareRegion(q, *owner, m.region_id);
  }
  return ENOENT;
}

// DirectEnded (posted): the library's connection `conn` ended (docs/direct-path.md). The
// router forgets it, so that the next QP pair of the two processes makes a new one. A dial
// that the pod network refused is logged once, naming the pod, the peer and the error: it
// is what a NetworkPolicy that does not admit --direct-ports between the two pods looks like.
int DirectEnded(Request& q) {
  const auto m = proto::As<proto::DirectEnded>(q.msg);
  const std::optional<DirectConnections::Conn> c = q.b.direct.Forget(q.pod.id, m.conn);
  if (!c) return ENOENT;  // forgotten already (its listener failed), or never known
  const int e = static_cast<int>(m.error);
  if (e == ECONNREFUSED || e == ETIMEDOUT || e == EHOSTUNREACH || e == ENETUNREACH) {
    spdlog::info(
        "client {} ({}): the pod network refused its direct connection to {} port {}: {} (does "
        "a NetworkPolicy admit --direct-ports between the two pods?)",
        q.pod.id, FormatIpv4(q.pod.who.ip), FormatIpv4(c->peer_ip), c->port, std::strerror(e));
  } else {
    spdlog::debug("client {}: direct connection {:#x} with {} ended: {}", q.pod.id, m.conn,
                  FormatIpv4(c->peer_ip), m.error != 0 ? std::strerror(e) : "closed");
  }
  return 0;
}

// Requests answered at once, indexed by proto::Op (HELLO, the connects and rdma_cm are
// not; nor is TCP mode, which Broker::OnRequest hands to the socket service).
constexpr Handler kHandlers[] = {
    nullptr,    nullptr,       &CreateChannel, &DestroyChannel, &CreateCq, &DestroyCq,
    &CreateSrq, &DestroySrq,   &CreateQp,      &DestroyQp,      nullptr,   &DisconnectQp,
    nullptr,    &RegMr,        &DeregMr,       &GetRegion,      &MoveMr,   &AllocMw,
    &BindMw,    &InvalidateMw, &DeallocMw,     nullptr,         nullptr,   nullptr,
    nullptr,    nullptr,       nullptr,        nullptr,         nullptr,   nullptr,
    nullptr,    nullptr,       nullptr,        &DirectEnded,    nullptr};
static_assert(sizeof(kHandlers) / sizeof(kHandlers[0]) == static_cast<size_t>(proto::Op::kMaxOp));

// Its ABI was checked by the session layer.
void Hello(Broker::Parts& b, const Call& call, UniqueFd* fds) {
  proto::Response r{};
  int type = 0;
  socklen_t tl = sizeof(type);
  // The notify words go to every peer of the process: no peer may seal them (FreezeSeals).
  if (!SealedAtLeast(fds[0].get(), kNotifySegmentBytes) || FreezeSeals(fds[0].get()) != 0 ||
      ::getsockopt(fds[1].get(), SOL_SOCKET, SO_TYPE, &type, &tl) != 0 || type != SOCK_SEQPACKET ||
      !IsWakeSocket(fds[2].get()))
    return b.sessions.Answer(call, EINVAL, r);
  if (const int rc = b.quotas.Take(call.pod, {{Quota::kFds, kHelloFds}})) {
    std::snprintf(r.u.hello.node, sizeof(r.u.hello.node),
                  "descriptor quota reached (--max-fds-per-pod)");
    return b.sessions.Answer(call, rc, r);
  }
  ::fcntl(fds[1].get(), F_SETFL, O_NONBLOCK);
  const PodIdentity who = *b.sessions.Identity(call.pod);
  Pod& pod = b.tables.AddPod(call.pod, who);
  if (const int rc = pod.mr.Create()) {
    b.tables.ErasePod(call.pod);
    b.quotas.Give(call.pod, {{Quota::kFds, kHelloFds}});
    return b.sessions.Answer(call, rc, r);
  }
  pod.notify_seg = std::move(fds[0]);
  pod.wake_fd = std::move(fds[2]);
  b.directory.Publish(who.ip);
  r.u.hello.ctx_id = call.pod;
  r.u.hello.ip = htonl(who.ip);
  r.u.hello.lid = LidForIp(who.ip, b.overlay);
  r.u.hello.prefix_len = b.overlay.length;
  std::snprintf(r.u.hello.node, sizeof(r.u.hello.node), "%s", b.node_name.c_str());
  b.sessions.Welcome(call.pod, std::move(fds[1]));
  const int table = pod.mr.read_only_fd();
  b.sessions.Answer(call, 0, r, &table, 1);
}

// `qp` (of `owner`) has been named by the peer it asked for: it may link now (kPeerNamed),
// when it asked. Telling a QP that never asked would only wake its process for nothing.
void TellIfAsked(Broker::Parts& b, const Pod& owner, Qp& qp) {
  if (qp.TakeAsked()) b.sessions.Notify(owner.id, proto::EventType::kPeerNamed, qp.qpn);
}

// Gives `src` a ring of `dest` (both on this node) and the peer's segments.
int ConnectLocal(Broker::Parts& b, const Pod& pod, Qp& src, Qp& dest, bool ud, proto::Response* r,
                 std::vector<int>* fds) {
  if (dest.kind != src.kind) return EINVAL;
  if (!dest.Consents(pod.who.ip, src.qpn)) {  // it has not named us (yet)
    src.asked = !ud;
    return EINPROGRESS;
  }
  const int ring = dest.RingFor(Producer::Local(src.qpn));
  if (ring < 0) return EBUSY;
  Pod* owner = b.tables.FindPod(dest.owner);
  if (owner == nullptr) return EHOSTUNREACH;
  const auto r_index = static_cast<uint32_t>(ring);
  if (ud && dest.producers[r_index] != Producer::Local(src.qpn)) {
    b.executor.TakeUdRing(dest, r_index);  // perhaps another sender's
    proto::Event e{};
    if (const int rc = dest.NewUdRing(r_index, pod.who.ip, src.qpn, &e)) return rc;
    b.sessions.NotifyWithFd(owner->id, e, dest.ud_rings[r_index].get());
  }
  if (!ud) b.tables.Unlink(src, &dest);  // an RC/UC QP sends to one peer
  proto::ConnectReply& c = r->u.connect;
  c.peer_ctx_id = owner->id;
  c.peer_qpn = dest.qpn;
  c.peer_ip = htonl(owner->who.ip);
  c.peer_lid = LidForIp(owner->who.ip, b.overlay);
  c.ring_index = static_cast<uint32_t>(ring);
  c.num_rings = dest.num_rings;
  c.ring_bytes = dest.ring_bytes;
  c.peer_qp_type = dest.kind->type;
  c.notify_slot = proto::kNoId;
  c.has_srq = 0;
  if (const int rc = dest.FreezeSegment()) return rc;
  *fds = {dest.seg.get(), owner->notify_seg.get(), owner->mr.read_only_fd()};
  int channel = -1;
  if (owner->CqChannel(dest.recv_cq_id, &c.notify_slot, &channel)) fds->push_back(channel);
  // No sender ever gets an SRQ: a QP's senders claim on its header's credits, and its
  // owner claims each message on the SRQ when it takes it (shm_layout.h, SrqSegment).
  if (ud) {
    c.flags |= proto::kConnectOwnRing;
    fds->push_back(dest.ud_rings[r_index].get());
  }
  dest.GiveRing(r_index, Producer::Local(src.qpn));
  src.produces_into.insert(dest.qpn);
  src.asked = false;
  TellIfAsked(b, *owner, dest);  // src, which dest may have asked for, names it now
  return 0;
}

// An RC/UC QP names its peer. Naming another than before forgets the old connection
// first (the library does that at RESET; a pod speaking the protocol itself may not).
void Name(Broker::Parts& b, Qp& src, const Qp::Named& peer) {
  if (src.named == peer) return;
  if (src.named.qpn != proto::kNoId) Disconnect(b, src);
  src.named = peer;
  src.asked = false;  // what it asked for was for another peer
}

// The peer's address: dest_ip (network order), or, with none, the pod at LID `lid`'s offset
// of the overlay, on any node; from here on the peer is that address, as if the program
// had given its GID. 0 when the LID names no overlay address.
uint32_t PeerIp(const Broker::Parts& b, const Pod& pod, uint32_t dest_ip, uint16_t lid) {
  const uint32_t ip = dest_ip != 0 ? ntohl(dest_ip) : IpForLid(lid, b.overlay);
  if (ip == 0) spdlog::info("client {}: LID {} names no overlay address", pod.id, lid);
  return ip;
}

// NameQp (RC/UC, at RTR): the QP names its peer and nothing is linked. A QP of this node
// that named this one first may have asked for it already: it may link now.
int NameQp(Broker::Parts& b, Pod& pod, const proto::NameQp& m) {
  Qp* src = b.tables.FindOwnedQp(pod, m.qpn);
  if (src == nullptr) return ENOENT;
  if (src->kind->datagram) return EINVAL;
  const uint32_t ip = PeerIp(b, pod, m.dest_ip, m.dest_lid);
  if (ip == 0) return EHOSTUNREACH;
  Name(b, *src, Qp::Named{ip, m.dest_qpn});
  Qp* dest = b.tables.FindDest(ip, m.dest_qpn);
  if (dest == nullptr || dest->kind != src->kind || !dest->Consents(pod.who.ip, src->qpn)) return 0;
  if (const Pod* owner = b.tables.FindPod(dest->owner)) TellIfAsked(b, *owner, *dest);
  return 0;
}

// ConnectQp (RC/UC, at RTR) and ResolveUd: a QP of this node answers now; one on another
// node is the forwarder's, which answers when the peer router replies.
void Connect(Broker::Parts& b, const Call& call, Pod& pod, const char* msg) {
  const auto m = proto::As<proto::ConnectQp>(msg);
  const bool ud = call.op == proto::Op::kResolveUd;
  Qp* src = b.tables.FindOwnedQp(pod, m.qpn);
  if (src == nullptr) return b.sessions.Answer(call, ENOENT);
  if (src->kind->datagram != ud) return b.sessions.Answer(call, EINVAL);
  const uint32_t ip = PeerIp(b, pod, m.dest_ip, m.dest_lid);
  if (ip == 0) return b.sessions.Answer(call, EHOSTUNREACH);
  if (!ud) Name(b, *src, Qp::Named{ip, m.dest_qpn});
  Qp* dest = b.tables.FindDest(ip, m.dest_qpn);
  if (dest == nullptr && !b.directory.IsLocal(ip))
    return b.forwarder.Connect(call, *src, ip, m.dest_qpn, ud,
                               ud && (m.flags & proto::kResolveAgain) != 0);
  if (dest == nullptr) {
    spdlog::info("client {}: no QP {:#x} at {}", pod.id, m.dest_qpn, FormatIpv4(ip));
    return b.sessions.Answer(call, EHOSTUNREACH);
  }
  proto::Response r{};
  std::vector<int> fds;
  const int status = ConnectLocal(b, pod, *src, *dest, ud, &r, &fds);
  b.sessions.Answer(call, status, r, fds.data(), static_cast<int>(fds.size()));
}

}  // namespace

bool Broker::OnRequest(const Call& call, const char* msg, UniqueFd* fds, int nfds) {
  if (call.op == proto::Op::kSockHello || proto::IsSocketOp(call.op))
    return parts_.sockets.OnRequest(call, msg);
  if (call.op == proto::Op::kHello) {
    Hello(parts_, call, fds);
    return true;
  }
  Pod* pod = parts_.tables.FindPod(call.pod);
  if (pod == nullptr) return false;  // requests before a successful HELLO
  if (call.op == proto::Op::kConnectQp || call.op == proto::Op::kResolveUd) {
    Connect(parts_, call, *pod, msg);
    return true;
  }
  if (call.op == proto::Op::kNameQp) {
    parts_.sessions.Answer(call, NameQp(parts_, *pod, proto::As<proto::NameQp>(msg)));
    return true;
  }
  if (call.op == proto::Op::kCmOpenChannel) {
    parts_.cm.OpenChannel(call, proto::As<proto::CmOpenChannel>(msg), std::move(fds[0]));
    return true;
  }
  if (call.op == proto::Op::kCmCommand) {
    parts_.cm.Command(call, pod->who.ip, proto::As<proto::CmCommand>(msg));
    return true;
  }
  Request q{parts_, *pod, msg, fds, nfds, call.seq == proto::kPostedSeq};
  const int status = kHandlers[static_cast<size_t>(call.op)](q);
  parts_.sessions.Answer(call, status, q.reply, q.reply_fds.data(),
                         static_cast<int>(q.reply_fds.size()));
  return true;
}

void Broker::OnPodGone(PodId id) {
  parts_.sockets.OnPodGone(id);
  Pod* pod = parts_.tables.FindPod(id);
  if (pod == nullptr) return;  // it never completed HELLO
  parts_.cm.OnPodGone(id);
  spdlog::info("client {}: releasing {} QPs, {} regions", id, pod->qps.size(), pod->regions.size());
  const std::set<uint32_t> qps = pod->qps;
  for (uint32_t qpn : qps) {
    if (Qp* qp = parts_.tables.FindQp(qpn)) ReleaseQp(parts_, *qp, true);
    parts_.tables.EraseQp(qpn);
  }
  for (uint32_t qpn : pod->qpn_grants) parts_.tables.ReleaseQpn(qpn);
  parts_.direct.ForgetPod(id);
  parts_.directory.Withdraw(pod->who.ip);
  parts_.tables.ErasePod(id);
}

}  // namespace ff::router
