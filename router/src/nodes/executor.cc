#include "nodes/executor.h"

#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/find.h"
#include "freeflow/ipv4.h"

namespace ff::router {

Executor::Verdict Executor::OnMessage(LinkId link, const NodeMessage& m) {
  switch (m.type) {
    case wire::Type::kConnect: {
      wire::Connect c;
      std::memcpy(&c, m.body, sizeof(c));
      Connect(link, m.chan, c);
      return Verdict::kConsumed;
    }
    case wire::Type::kRecord:
      return Record(link, m.chan, m.body, m.len);
    case wire::Type::kClose:
      std::erase_if(unresolved_,
                    [&](const Unresolved& u) { return u.link == link && u.chan == m.chan; });
      if (Sender* s = Find(link, m.chan)) CloseSender(*s, m.flags != 0);
      return Verdict::kConsumed;
    default:
      return Verdict::kMalformed;  // answers travel the other way
  }
}

Executor::Sender* Executor::Find(LinkId link, uint32_t chan) {
  return FindIn(senders_, Key{link, chan});
}

void Executor::Connect(LinkId link, uint32_t chan, const wire::Connect& m, uint64_t deadline_ns,
                       uint64_t crossed_ns) {
  wire::ConnectReply reply{};
  auto answer = [&](int status) {
    reply.status = status;
    if (status != 0) reply = wire::ConnectReply{status, 0, 0, 0};  // nothing of a direct one
    parts_.transport->Send(link, wire::Type::kConnectReply, chan, 0, {{&reply, sizeof(reply)}});
  };
  const std::string peer = parts_.transport->PeerNode(link);
  // A router asks for a direct channel with its process's token, or for nothing.
  if ((m.flags & ~wire::kConnectAskDirect) != 0 ||
      ((m.flags & wire::kConnectAskDirect) != 0) != (m.token != 0)) {
    spdlog::warn("router {} sent a connect with flags {:#x} and token {:#x}: refused", peer,
                 m.flags, m.token);
    refusals_.Note(ConnectRefusal::kMalformed);
    return answer(EPROTO);
  }
  const std::optional<cp::Endpoint> from = parts_.directory.Locate(m.src_ip);
  if (!from) {
    // Perhaps a pod that just started, whose entry is still on its way: look again on the
    // router's timer until the deadline (RetryUnresolved).
    const uint64_t now = MonotonicNs();
    if (deadline_ns == 0) deadline_ns = now + kSourceResolveNs;
    if (now < deadline_ns) {
      unresolved_.push_back({link, chan, m, deadline_ns, 0});
      parts_.retry_soon();
      return;
    }
    spdlog::warn("router {} connected as {} (QP {:#x}), which no node holds: refused", peer,
                 FormatIpv4(m.src_ip), m.src_qpn);
    refusals_.Note(ConnectRefusal::kUnknownPod);
    return answer(EACCES);
  }
  if (from->node != peer) {
    spdlog::warn("router {} connected as {} (QP {:#x}), a pod of node {}: refused", peer,
                 FormatIpv4(m.src_ip), m.src_qpn, from->node);
    refusals_.Note(ConnectRefusal::kPodOfAnotherNode);
    return answer(EACCES);
  }
  Qp* dest = parts_.tables.FindDest(m.dest_ip, m.dest_qpn);
  Pod* owner = dest != nullptr ? parts_.tables.FindPod(dest->owner) : nullptr;
  if (owner == nullptr) return answer(EHOSTUNREACH);
  if (dest->kind != QpKindOf(m.qp_type)) return answer(EINVAL);
  // An RC/UC QP takes data only from the QP its owner named: until then, "ask again".
  if (!dest->Consents(m.src_ip, m.src_qpn)) return answer(EINPROGRESS);
  if (WaitsForCrossedAsk(m, *owner, &crossed_ns)) {
    unresolved_.push_back({link, chan, m, deadline_ns, crossed_ns});
    parts_.retry_soon();
    return;
  }
  if (senders_.count({link, chan})) Drop({link, chan}, TellPeer::kNo, DropCause::kClosed);
  auto s = std::make_unique<Sender>();
  s->id = next_id_++;
  const int ring = dest->RingFor(Producer::Remote(s->id));
  if (ring < 0) return answer(EBUSY);
  s->link = link;
  s->chan = chan;
  s->src_ip = m.src_ip;
  s->src_qpn = m.src_qpn;
  s->target_qpn = dest->qpn;
  s->recv_cq_id = dest->recv_cq_id;
  s->owner = owner->id;
  s->kind = dest->kind;
  s->direct = WantsDirect(m) && DirectConn(m, *owner, &reply);
  s->conn = s->direct ? reply.conn : 0;
  if (s->direct) {
    // Nothing to map: the owner's process takes the records itself (UD: into a ring of the
    // channel's own, which TellChannel hands over).
    if (const int rc =
            dest->kind->datagram ? NewUdRingFor(*dest, *owner, m, static_cast<uint32_t>(ring)) : 0)
      return answer(rc);
  } else if (const int rc = MapTarget(*s, *dest, *owner, m, static_cast<uint32_t>(ring))) {
    return answer(rc);
  }
  dest->GiveRing(static_cast<size_t>(ring), Producer::Remote(s->id));
  // Before the reply: the initiator's process sends on the channel once it has it.
  if (s->direct) {
    const int ud_ring = dest->kind->datagram ? dest->ud_rings[ring].get() : -1;
    TellChannel(*s, static_cast<uint32_t>(ring), owner->id, false, ud_ring);
  }
  reply.peer_qpn = dest->qpn;
  reply.peer_ip = owner->who.ip;
  reply.qp_type = dest->kind->type;
  by_id_[s->id] = {link, chan};
  senders_[{link, chan}] = std::move(s);
  answer(0);
  // The target may have asked for its initiator before the initiator named it; one that
  // never asked links when it first sends (Qp::asked).
  if (dest->TakeAsked()) parts_.sessions.Notify(owner->id, proto::EventType::kPeerNamed, dest->qpn);
}

// A relayed sender executes into the target: its segments mapped, a ring to produce into
// (UD: one of its own, the owner told whose). 0 or the errno the connect is answered with.
int Executor::MapTarget(Sender& s, Qp& dest, Pod& owner, const wire::Connect& m, uint32_t ring) {
  s.queued = Held(parts_.quotas, owner.id, Quota::kQueuedBytes);
  s.mapped = Held(parts_.quotas, owner.id, Quota::kMappedBytes);
  const uint64_t seg_bytes = QpSegmentBytes(dest.num_rings, dest.ring_bytes);
  // Claims on the target's header credits, on an SRQ or not: its owner claims each message
  // on the SRQ when it takes it (shm_layout.h, SrqSegment).
  if (const int rc = s.mapped.Take(seg_bytes)) return rc;
  if (const int rc = dest.FreezeSegment()) return rc;
  if (MapSegment(dest.seg.get(), seg_bytes, true, &s.seg) != 0) return ENOMEM;
  auto* hdr = s.seg.as<QpSegmentHeader>();
  RecvCredits* credits = &hdr->credits;
  RingHeader* produce_into = nullptr;
  if (dest.kind->datagram) {
    if (const int rc = NewUdRingFor(dest, owner, m, ring)) return rc;
    if (MapSegment(dest.ud_rings[ring].get(), UdRingBytes(dest.ring_bytes), true, &s.ud_ring) != 0)
      return ENOMEM;
    produce_into = s.ud_ring.as<RingHeader>();
  } else {
    produce_into = QpRing(s.seg.get(), ring, dest.ring_bytes);
  }
  TargetChannel::Setup setup;
  setup.kind = dest.kind;
  setup.hdr = hdr;
  setup.credits = credits;
  setup.ring = produce_into;
  setup.ring_bytes = dest.ring_bytes;
  setup.target_qpn = dest.qpn;
  setup.src_ip = m.src_ip;
  setup.src_qpn = m.src_qpn;
  s.target.Init(setup);
  return 0;
}

int Executor::NewUdRingFor(Qp& dest, Pod& owner, const wire::Connect& m, uint32_t ring) {
  // A ring of its own, and the receiver told whose it is (never read from the records).
  proto::Event e{};
  TakeUdRing(dest, ring);
  if (dest.NewUdRing(ring, m.src_ip, m.src_qpn, &e) != 0) return ENOMEM;
  parts_.sessions.NotifyWithFd(owner.id, e, dest.ud_rings[ring].get());
  return 0;
}

Executor::Verdict Executor::Record(LinkId link, uint32_t chan, const char* body, uint32_t len) {
  RecordHeader h;
  const char* payload = nullptr;
  RequestView v;
  if (!SplitRecord(body, len, &h, &payload) || !DecodeRequest(h, payload, &v))
    return Verdict::kMalformed;
  if (parts_.transport->Congested(link)) {
    // A READ answer is far larger than its request: execute nothing more for this link
    // until what we owe its peer has drained.
    held_for_output_.insert(link);
    return Verdict::kHold;
  }
  Sender* s = Find(link, chan);
  if (s == nullptr || s->direct) {
    // The target went away: every request still gets its one answer, an error, as an RC
    // requester would see its retries run out. A direct channel's records go pod to pod:
    // one sent here is answered the same.
    if (v.req.last || h.kind == kRecReadReq || h.kind == kRecAtomicReq)
      Respond(link, chan, v.req.seq, IBV_WC_RETRY_EXC_ERR, 0, nullptr, 0, true);
    return Verdict::kConsumed;
  }
  if (s->queue.empty() && Apply(*s, v)) {
    Publish(*s);  // the common case: executed from the receive buffer, no copy
    Credit(*s, len);
    return Verdict::kConsumed;
  }
  // The initiator keeps within the channel's window; the pod's queue quota bounds a peer
  // that does not.
  if (s->queued.Take(len) != 0) return Overflow(*s, v);
  s->queue.emplace_back(body, body + len);
  Run(*s);
  return Verdict::kConsumed;
}

// What TargetChannel asks of the router for one relayed sender: answers go on its link,
// READ data only while the link is not congested, and the target's memory is the owner
// pod's MR table and regions, mapped here.
struct Executor::TargetHost {
  Executor* e;
  Sender* s;
  Pod* owner;
  void Respond(uint32_t seq, uint32_t status, uint64_t offset, const char* data, uint32_t len,
               bool last) {
    e->Respond(s->link, s->chan, seq, status, offset, data, len, last);
  }
  bool CanAnswer() { return !e->parts_.transport->Congested(s->link); }
  const MrEntry* MrTable() { return owner->mr.entries(); }
  const Mapping* MapRegion(uint32_t region, uint32_t need) {
    return e->MapRegion(*owner, region, need);
  }
};

bool Executor::Apply(Sender& s, const RequestView& v) {
  Pod* owner = parts_.tables.FindPod(s.owner);
  if (owner == nullptr) return true;
  TargetHost host{this, &s, owner};
  return s.target.Apply(host, v);
}

// Region `id` of `owner` mapped into the router; the first mapping is charged to the
// owner's kMappedBytes. nullptr when unknown, over the quota or not mappable.
const Mapping* Executor::MapRegion(Pod& owner, uint32_t id, uint32_t need) {
  auto it = owner.regions.find(id);
  if (it == owner.regions.end()) return nullptr;
  const uint64_t size = it->second.size;
  const bool fresh = it->second.map.get() == nullptr;
  if (fresh && parts_.quotas.Take(owner.id, {{Quota::kMappedBytes, size}}) != 0) return nullptr;
  if (owner.MappedRegion(id, need) == nullptr) {
    if (fresh && it->second.map.get() == nullptr)
      parts_.quotas.Give(owner.id, {{Quota::kMappedBytes, size}});
    return nullptr;
  }
  return &it->second.map;
}

void Executor::Respond(LinkId link, uint32_t chan, uint32_t seq, uint32_t status, uint64_t offset,
                       const char* data, uint32_t len, bool last) {
  const ProxyResponse r{offset, seq, static_cast<uint16_t>(status),
                        static_cast<uint8_t>(last ? 1 : 0), 0};
  const RecordHeader h = ResponseHeader(len);
  parts_.transport->Send(link, wire::Type::kResp, chan, 0,
                         {{&h, sizeof(h)}, {&r, sizeof(r)}, {data, len}});
}

// Publishes what the target's ring received and wakes its program if it waits for that.
// WRITEs, READs and atomics leave nothing in the ring, so they wake nobody: a program asleep
// in poll_cq (on any CQ: the wake word is the process's) was woken for every batch of
// WRITEs it received, and those wake-ups took the CPU the routers needed.
void Executor::Publish(Sender& s) {
  bool solicited = false;
  if (!s.target.Publish(&solicited)) return;
  Pod* owner = parts_.tables.FindPod(s.owner);
  if (owner == nullptr) return;
  const WakeTarget cq = owner->CqWake(s.recv_cq_id);
  if (cq) WakeIfArmed(cq.slot, cq.fd, solicited);
  owner->WakeProcess();
}

void Executor::Run(Sender& s) {
  uint64_t done = 0;
  while (!s.queue.empty()) {
    const std::vector<char>& rec = s.queue.front();
    RecordHeader h;
    const char* payload = nullptr;
    RequestView v;
    // Queued records were checked on arrival; they live in router memory since.
    SplitRecord(rec.data(), rec.size(), &h, &payload);
    DecodeRequest(h, payload, &v);
    if (!Apply(s, v)) break;
    s.queued.Give(rec.size());
    done += rec.size();
    s.queue.pop_front();
  }
  Publish(s);  // only what went into the target's ring
  const Key key{s.link, s.chan};
  if (s.closing) {
    // Nobody reads credits for a closed channel.
    if (s.queue.empty() || MonotonicNs() >= s.close_deadline_ns) {
      if (!s.queue.empty())
        spdlog::info("QP {:#x}: {} datagrams of closed remote QP {:#x} found no room in time",
                     s.target_qpn, s.queue.size(), s.src_qpn);
      return Drop(key, TellPeer::kNo, CauseOf(s.close_died));
    }
  } else if (done != 0) {
    Credit(s, done);
  }
  if (s.queue.empty()) {
    waiting_.erase(key);
  } else if (waiting_.insert(key).second) {
    parts_.retry_soon();
  }
}

// The initiator closed the channel. Its UD datagrams that still wait for room in the
// target's ring were complete for their program once posted, as on a NIC once they left
// it: they still arrive (a sender that exits right after its last send lost up to half of
// a 100-message burst, udaddy's replies across nodes). Anything else goes now.
void Executor::CloseSender(Sender& s, bool died) {
  if (!s.kind->datagram || s.queue.empty())
    return Drop({s.link, s.chan}, TellPeer::kNo, CauseOf(died));
  s.closing = true;
  s.close_died = died;
  s.close_deadline_ns = MonotonicNs() + kUdCloseDrainNs;
  Run(s);
}

void Executor::Credit(Sender& s, uint64_t bytes) {
  s.uncredited += bytes;
  if (s.uncredited < kCreditBatch) return;
  const wire::Credit c{s.uncredited};
  s.uncredited = 0;
  parts_.transport->Send(s.link, wire::Type::kCredit, s.chan, 0, {{&c, sizeof(c)}});
}

bool Executor::Retry() {
  RunWaiting(kNoLink);
  RetryUnresolved();
  return !waiting_.empty() || !unresolved_.empty();
}

void Executor::RetryUnresolved() {
  std::vector<Unresolved> pending;
  pending.swap(unresolved_);
  for (const Unresolved& u : pending) Connect(u.link, u.chan, u.m, u.deadline_ns, u.crossed_ns);
}

void Executor::RunWaiting(LinkId link) {
  const std::set<Key> waiting = waiting_;
  for (const Key& key : waiting) {
    if (link != kNoLink && key.first != link) continue;
    auto it = senders_.find(key);
    if (it == senders_.end()) {
      waiting_.erase(key);
      continue;
    }
    Run(*it->second);
  }
}

void Executor::OnDrained(LinkId link) {
  if (held_for_output_.erase(link)) parts_.transport->Resume(link);
  RunWaiting(link);  // READs that paused for this link
}

// The target pod's queue quota is spent: the router queues no more for it. The request
// fails and the connection closes on both sides; a UD datagram is just lost.
Executor::Verdict Executor::Overflow(Sender& s, const RequestView& v) {
  if (s.kind->datagram) return Verdict::kConsumed;
  Respond(s.link, s.chan, v.req.seq, IBV_WC_RNR_RETRY_EXC_ERR, 0, nullptr, 0, true);
  parts_.sessions.Notify(s.owner, proto::EventType::kPeerGone, s.target_qpn);
  Drop({s.link, s.chan}, TellPeer::kYes, DropCause::kDied);
  return Verdict::kConsumed;
}

void Executor::ReleaseSender(uint32_t id, bool died) {
  auto it = by_id_.find(id);
  if (it != by_id_.end()) Drop(it->second, TellPeer::kYes, CauseOf(died));
}

void Executor::LoseUdRing(Qp& dest, size_t ring, bool died) {
  const Producer p = dest.producers[ring];
  if (p.kind == Producer::Kind::kRemote) ReleaseSender(p.id, died);
  if (p.kind == Producer::Kind::kLocalQp) {
    Qp* from = parts_.tables.FindQp(p.id);
    const Pod* owner = parts_.tables.FindPod(dest.owner);
    if (from != nullptr && owner != nullptr) {
      from->produces_into.erase(dest.qpn);
      const proto::Event e{proto::EventType::kUdPeerLost, from->qpn, 0, owner->who.ip, dest.qpn, 0};
      parts_.sessions.NotifyWithFd(from->owner, e, -1);
    }
  }
  dest.FreeRing(ring);
}

void Executor::TakeUdRing(Qp& dest, size_t ring) {
  if (dest.producers[ring].kind != Producer::Kind::kNone) ++ud_rings_taken_;
  LoseUdRing(dest, ring, false);
}

void Executor::Drop(Key key, TellPeer tell, DropCause cause) {
  // By value: callers pass keys that live in the maps this erases from (by_id_).
  const bool died = cause == DropCause::kDied;
  auto it = senders_.find(key);
  if (it == senders_.end()) return;
  std::unique_ptr<Sender> s = std::move(it->second);
  senders_.erase(it);
  by_id_.erase(s->id);
  waiting_.erase(key);
  if (tell == TellPeer::kYes)
    parts_.transport->Send(s->link, wire::Type::kPeerGone, s->chan, died ? 1 : 0, {});
  if (Qp* q = parts_.tables.FindQp(s->target_qpn)) {
    q->ReleaseRingsOf(Producer::Remote(s->id));
    if (s->direct) TellChannel(*s, 0, q->owner, true, -1);
    // The remote peer is gone: a connected RC/UC target learns it as from a local peer.
    if (tell == TellPeer::kNo && !s->kind->datagram) {
      parts_.sessions.Notify(q->owner,
                             died ? proto::EventType::kPeerGone : proto::EventType::kPeerClosed,
                             s->target_qpn);
    }
  }
}

void Executor::OnLinkDown(LinkId link) {
  held_for_output_.erase(link);
  std::erase_if(unresolved_, [link](const Unresolved& u) { return u.link == link; });
  std::vector<Key> keys;
  for (const auto& [key, s] : senders_)
    if (key.first == link) keys.push_back(key);
  for (const Key& key : keys) Drop(key, TellPeer::kNo, DropCause::kDied);
}

}  // namespace ff::router
