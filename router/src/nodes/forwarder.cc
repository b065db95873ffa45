#include "nodes/forwarder.h"

#include <arpa/inet.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/find.h"
#include "freeflow/ipv4.h"
#include "freeflow/target_ops.h"

namespace ff::router {

Forwarder::~Forwarder() {
  for (auto& [chan, p] : proxies_) loop_.Unwatch(p->doorbell_watch);
}

Forwarder::Proxy* Forwarder::Find(LinkId link, uint32_t chan) {
  Proxy* p = FindIn(proxies_, chan);
  return p != nullptr && p->link == link ? p : nullptr;
}

void Forwarder::Connect(const Call& call, Qp& src, uint32_t dest_ip, uint32_t dest_qpn, bool ud,
                        bool at_once) {
  if (parts_.transport == nullptr || !parts_.directory.cluster()) {
    spdlog::info("client {}: {} is not a pod of this node and no control plane is configured",
                 call.pod, FormatIpv4(dest_ip));
    return parts_.sessions.Answer(call, EHOSTUNREACH);
  }
  if (auto ep = parts_.directory.Locate(dest_ip))
    return Open(call, src, *ep, dest_ip, dest_qpn, ud);
  if (at_once) {  // a UD destination refused before: its datagram is dropped now
    spdlog::debug("client {}: no node is known for {}", call.pod, FormatIpv4(dest_ip));
    return parts_.sessions.Answer(call, EHOSTUNREACH);
  }
  if (options_.resolve_timeout_ms == 0) {
    spdlog::info("client {}: no node is known for {}", call.pod, FormatIpv4(dest_ip));
    return parts_.sessions.Answer(call, EHOSTUNREACH);
  }
  // Perhaps a pod that just opened its device: its entry may still be on its way.
  resolving_.push_back({call, src.qpn, dest_ip, dest_qpn, ud,
                        MonotonicNs() + options_.resolve_timeout_ms * 1'000'000ull});
  parts_.retry_soon();
}

void Forwarder::RetryResolves(uint64_t now) {
  std::vector<PendingResolve> waiting;
  waiting.swap(resolving_);
  for (const PendingResolve& r : waiting) {
    Pod* pod = parts_.tables.FindPod(r.call.pod);
    if (pod == nullptr) continue;
    Qp* src = parts_.tables.FindOwnedQp(*pod, r.qpn);
    if (src == nullptr) {
      parts_.sessions.Answer(r.call, ENOENT);
      continue;
    }
    if (auto ep = parts_.directory.Locate(r.dest_ip)) {
      Open(r.call, *src, *ep, r.dest_ip, r.dest_qpn, r.ud);
    } else if (now < r.deadline_ns) {
      resolving_.push_back(r);
    } else {
      spdlog::info("client {}: no node is known for {}", r.call.pod, FormatIpv4(r.dest_ip));
      parts_.sessions.Answer(r.call, EHOSTUNREACH);
    }
  }
}

int Forwarder::MakeSegment(Proxy& p) {
  const size_t bytes = QpSegmentBytes(kProxyRings, kProxyRingBytes);
  if (const int rc = CreateSegment("ffrouter-proxy", bytes, &p.seg_fd)) return rc;
  if (const int rc = MapSegment(p.seg_fd.get(), bytes, true, &p.seg)) return rc;
  auto* hdr = new (p.seg.get()) QpSegmentHeader();
  hdr->magic = kQpSegMagic;
  hdr->abi = kAbiVersion;
  hdr->num_rings = kProxyRings;
  hdr->ring_bytes = kProxyRingBytes;
  p.requests.Attach(QpRing(p.seg.get(), kProxyRequestRing, kProxyRingBytes), kProxyRingBytes);
  p.responses.Attach(QpRing(p.seg.get(), kProxyResponseRing, kProxyRingBytes), kProxyRingBytes);
  // The library rings the doorbell through the sending end; the router only ever drains
  // its own receiving end without blocking.
  return CreateWakePair(&p.doorbell, &p.doorbell_tx, true);
}

void Forwarder::Open(const Call& call, Qp& src, const cp::Endpoint& ep, uint32_t dest_ip,
                     uint32_t dest_qpn, bool ud) {
  const Pod* pod = parts_.tables.FindPod(call.pod);
  if (pod == nullptr) return;
  if (!ud) DropQp(src.qpn, false);  // an RC/UC QP has one peer: forget an earlier one
  if (ud) DropUdLinks(src.qpn, dest_ip, dest_qpn);  // the library asks only when it has none
  const LinkId link = parts_.transport->Dial(ep);
  if (link == kNoLink) return parts_.sessions.Answer(call, EHOSTUNREACH);
  if (ud) MakeRoomForUd(pod->who.ip);
  // UD only with --direct-datagrams; a process at its bound of direct connections asks for
  // none.
  const bool ask_direct =
      parts_.direct.on && (!ud || parts_.direct.datagrams) && !parts_.direct.conns->Full(call.pod);
  const uint64_t fds = ask_direct ? 0 : 2;  // a direct channel has no segment
  if (const int rc = parts_.quotas.Take(call.pod, {{Quota::kProxies, 1}, {Quota::kFds, fds}}))
    return parts_.sessions.Answer(call, rc);
  auto p = std::make_unique<Proxy>();
  p->chan = next_chan_++;
  p->pod = call.pod;
  p->qpn = src.qpn;
  p->dest_ip = dest_ip;
  p->dest_qpn = dest_qpn;
  p->link = link;
  p->ud = ud;
  p->ask_direct = ask_direct;
  p->fds = fds;
  if (const int rc = ask_direct ? 0 : MakeSegment(*p)) {
    parts_.quotas.Give(call.pod, {{Quota::kProxies, 1}, {Quota::kFds, fds}});
    return parts_.sessions.Answer(call, rc);
  }
  p->answer_pending = true;
  p->call = call;
  if (ask_direct) {
    parts_.direct.conns->Asking(call.pod, dest_ip);
    p->asking = true;
  }
  // Asked from the moment the request leaves: the peer may name src before the answer
  // (EINPROGRESS) comes back, and must then tell it (Executor::Connect, kPeerNamed).
  src.asked = !ud;
  p->connect_deadline_ns = MonotonicNs() + kDialTimeoutNs;
  const wire::Connect w{pod->who.ip,
                        src.qpn,
                        src.kind->type,
                        dest_ip,
                        dest_qpn,
                        ask_direct ? wire::kConnectAskDirect : 0,
                        ask_direct ? parts_.direct.conns->Token(call.pod) : 0};
  // What the pod published before it asked goes first: a UD connect may take the ring of
  // one of its own senders there (Executor::LoseUdRing), whose datagrams must not be lost
  // only because their doorbell had not been served yet.
  for (auto& [chan, other] : proxies_)
    if (other->link == link && other->pod == call.pod) Drain(*other);
  parts_.transport->Send(link, wire::Type::kConnect, p->chan, 0, {{&w, sizeof(w)}});
  by_qp_[src.qpn].insert(p->chan);
  proxies_[p->chan] = std::move(p);
}

int Forwarder::MakeLateSegment(Proxy& p) {
  if (const int rc = parts_.quotas.Take(p.pod, {{Quota::kFds, 2}})) return rc;
  p.fds = 2;
  return MakeSegment(p);
}

void Forwarder::EndAsk(Proxy& p) {
  if (!p.asking) return;
  p.asking = false;
  parts_.direct.conns->Answered(p.pod, p.dest_ip);
}

void Forwarder::Finish(Proxy& p, int status, const wire::ConnectReply* reply, bool peer_accepted) {
  const uint32_t chan = p.chan;
  EndAsk(p);
  peer_accepted = peer_accepted || status == 0;
  const bool direct = status == 0 && (reply->flags & wire::kReplyDirect) != 0;
  if (status == 0 && !direct && p.seg.get() == nullptr) status = MakeLateSegment(p);
  if (status != EINPROGRESS) {  // linked or failed: it waits for no name any more
    if (Qp* src = parts_.tables.FindQp(p.qpn)) src->asked = false;
  }
  const bool answered = p.answer_pending && parts_.sessions.Identity(p.pod) != nullptr;
  if (p.answer_pending) {
    p.answer_pending = false;
    proto::Response r{};
    if (status == 0 && direct) {
      AnswerDirect(p, *reply);
    } else if (status == 0) {
      proto::ConnectReply& c = r.u.connect;
      c.flags = proto::kConnectRemote;
      c.peer_qpn = reply->peer_qpn;
      c.peer_ip = htonl(reply->peer_ip);
      c.peer_lid = LidForIp(reply->peer_ip, options_.overlay);
      c.ring_index = 0;
      c.num_rings = kProxyRings;
      c.ring_bytes = kProxyRingBytes;
      c.notify_slot = proto::kNoId;
      c.peer_qp_type = reply->qp_type;
      const int fds[2] = {p.seg_fd.get(), p.doorbell_tx.get()};
      parts_.sessions.Answer(p.call, 0, r, fds, 2);
    } else {
      parts_.sessions.Answer(p.call, status, r);
    }
  }
  if (status != 0 || !answered) {
    if (status == EINPROGRESS) {
      spdlog::debug("QP {:#x} at {} has not named QP {:#x} yet", p.dest_qpn, FormatIpv4(p.dest_ip),
                    p.qpn);
    } else if (status != 0) {
      spdlog::info("connect to QP {:#x} at {} failed: {}", p.dest_qpn, FormatIpv4(p.dest_ip),
                   std::strerror(status));
    }
    // A peer that accepted hears that we are gone.
    return Drop(chan, peer_accepted ? TellPeer::kYes : TellPeer::kNo, DropCause::kClosed);
  }
  p.connected = true;
  if (direct) {
    p.direct = true;
    p.conn = reply->conn;
    if (reply->flags & wire::kReplyNewConn) {
      DirectConnections::Conn c;
      c.id = reply->conn;
      c.pod = p.pod;
      c.peer_ip = reply->peer_ip;
      c.peer_token = reply->token;
      c.port = reply->port;
      c.dialler = true;
      c.state = DirectConnections::State::kOpen;  // its router learns no more of it
      parts_.direct.conns->Add(c);                // CheckReply: an id the pod does not hold
    }
    return;  // no segment, no doorbell: the library sends on its own connection
  }
  p.doorbell_watch = loop_.Watch(p.doorbell.get(), EPOLLIN, [this, chan](uint32_t) {
    auto it = proxies_.find(chan);
    if (it == proxies_.end()) return;
    DrainWakes(it->second->doorbell.get());
    Drain(*it->second);
  });
  p.seg.as<QpSegmentHeader>()->doorbell.armed.store(1);
}

void Forwarder::AnswerDirect(Proxy& p, const wire::ConnectReply& reply) {
  proto::Response r{};
  proto::ConnectReply& c = r.u.connect;
  const bool fresh = (reply.flags & wire::kReplyNewConn) != 0;
  c.flags = proto::kConnectDirect | (fresh ? proto::kConnectDirectNew : 0);
  c.peer_qpn = reply.peer_qpn;
  c.peer_ip = htonl(reply.peer_ip);
  c.peer_lid = LidForIp(reply.peer_ip, options_.overlay);
  c.notify_slot = proto::kNoId;
  c.peer_qp_type = reply.qp_type;
  c.direct_chan = p.chan;  // what the frames of this channel carry, both ways
  c.direct_conn = reply.conn;
  c.direct_seal = reply.seal;
  if (fresh) {
    c.direct_port = reply.port;
    std::memcpy(c.direct_secret, reply.secret, sizeof(c.direct_secret));
  }
  parts_.sessions.Answer(p.call, 0, r);
}

int Forwarder::CheckReply(const Proxy& p, const wire::ConnectReply& r) const {
  if ((r.flags & ~(wire::kReplyDirect | wire::kReplyNewConn)) != 0) return EPROTO;
  if ((r.flags & wire::kReplyDirect) == 0) return r.flags == 0 ? 0 : EPROTO;  // relayed
  // Direct: asked for, from the pod the connect named (the library dials that address), in
  // a seal this side knows, naming both the connection and the peer's process.
  const auto seal = static_cast<SealMode>(r.seal);
  if (!p.ask_direct || r.peer_ip != p.dest_ip || r.conn == 0 || r.token == 0 ||
      (seal != SealMode::kEncrypt && seal != SealMode::kAuthenticate))
    return EPROTO;
  const DirectConnections::Conn* known = parts_.direct.conns->FindById(p.pod, r.conn);
  if (r.flags & wire::kReplyNewConn) return r.port == 0 || known != nullptr ? EPROTO : 0;
  if (known == nullptr) return ECONNRESET;  // it ended here and not yet there
  return known->peer_ip == r.peer_ip && known->peer_token == r.token ? 0 : EPROTO;
}

void Forwarder::MarkDead(Proxy& p, proto::EventType event) {
  p.dead = true;
  ReleaseReads(p);  // no answer comes any more
  if (!p.ud) return parts_.sessions.Notify(p.pod, event, p.qpn);
  // A UD QP does not fail: its library forgets this link and asks again when it next sends
  // there. The proxy itself goes on the next tick (the caller may be walking the proxies).
  parts_.sessions.NotifyWithFd(p.pod, UdLinkLost(p), -1);
  parts_.retry_soon();
}

proto::Event Forwarder::UdLinkLost(const Proxy& p) {
  return proto::Event{proto::EventType::kUdPeerLost, p.qpn, 0, p.dest_ip, p.dest_qpn, 0};
}

void Forwarder::MakeRoomForUd(uint32_t ip) {
  if (parts_.quotas.used(ip, Quota::kProxies) < parts_.quotas.limit(Quota::kProxies)) return;
  for (auto& [chan, p] : proxies_) {  // by channel number: the oldest first
    const PodIdentity* who = parts_.sessions.Identity(p->pod);
    if (p->ud && p->connected && who != nullptr && who->ip == ip) {
      ++ud_links_recycled_;
      return LoseUd(chan);
    }
  }
}

void Forwarder::LoseUd(uint32_t chan) {
  const Proxy& p = *proxies_.at(chan);
  const PodId pod = p.pod;
  const proto::Event e = UdLinkLost(p);
  Drop(chan, TellPeer::kYes, DropCause::kClosed);  // what the library published still goes
  parts_.sessions.NotifyWithFd(pod, e, -1);
}

void Forwarder::DropUdLinks(uint32_t qpn, uint32_t dest_ip, uint32_t dest_qpn) {
  auto q = by_qp_.find(qpn);
  if (q == by_qp_.end()) return;
  const std::set<uint32_t> chans = q->second;
  for (uint32_t chan : chans) {
    const Proxy& p = *proxies_.at(chan);
    if (p.ud && p.dest_ip == dest_ip && p.dest_qpn == dest_qpn)
      Drop(chan, TellPeer::kYes, DropCause::kClosed);
  }
}

// Forwards what the library published, a round at a time, then arms the doorbell and looks
// once more (the library checks `armed` after publishing, so one of the two sees the other).
void Forwarder::Drain(Proxy& p) {
  if (!p.connected || p.dead || p.direct) return;
  auto* hdr = p.seg.as<QpSegmentHeader>();
  size_t sent = 0;
  bool consumed = false;
  bool empty = false;  // the last look found nothing published
  for (int pass = 0; pass < 2; ++pass) {
    while (sent < kForwardRoundBytes && p.in_flight < kChannelWindow &&
           !parts_.transport->Congested(p.link)) {
      RecordHeader h;
      const char* payload = nullptr;
      const RingStatus rs = p.requests.Peek(&h, &payload);
      if (rs == RingStatus::kEmpty) break;
      RequestView v;
      if (rs == RingStatus::kCorrupt || !DecodeRequest(h, payload, &v)) {
        spdlog::warn("client {} corrupted the proxy ring of QP {:#x}", p.pod, p.qpn);
        return MarkDead(p, proto::EventType::kPeerGone);
      }
      if (!AdmitRead(p, v)) break;
      parts_.transport->Send(p.link, wire::Type::kRecord, p.chan, 0,
                             {{&h, sizeof(h)}, {payload, h.frag_len}});
      p.requests.Consume(h);
      consumed = true;
      sent += h.frag_len;
      p.in_flight += sizeof(h) + h.frag_len;
    }
    if (sent >= kForwardRoundBytes || parts_.transport->Congested(p.link) || p.waiting_reads ||
        p.in_flight >= kChannelWindow) {
      // More to do: come back on the next round, when the link drains, or with a credit.
      hdr->doorbell.armed.store(0);
      break;
    }
    if (options_.poll_us != 0) NoteTraffic();
    if (Polling()) {
      hdr->doorbell.armed.store(0, std::memory_order_relaxed);  // the library need not ring
      empty = true;
      break;
    }
    hdr->doorbell.armed.exchange(1, std::memory_order_seq_cst);
    RecordHeader h;
    const char* payload;
    const RingStatus rs = p.requests.Peek(&h, &payload);
    empty = rs == RingStatus::kEmpty;
    if (rs != RingStatus::kOk) break;
    hdr->doorbell.armed.store(0);
  }
  if (consumed) p.requests.Release();
  if (consumed && empty) RoomMade(p);
  if (sent >= kForwardRoundBytes) {
    // Yield to other proxies: a self-wake puts us behind them in the epoll queue.
    SendWake(p.doorbell_tx.get());
  }
}

// Writes one answer into the library's response ring; answers that find it full wait, in
// order, in the backlog.
void Forwarder::Deliver(Proxy& p, const RecordHeader& h, const char* payload) {
  if (p.backlog.empty()) {
    const RingStatus st = AppendRecord(p.responses, h, payload, h.frag_len);
    if (st == RingStatus::kOk) {
      p.responses.Publish();
      WakeOwner(p);
      return Delivered(p, payload);
    }
    if (st != RingStatus::kFull) return;  // the library corrupted its ring: it loses its answers
  }
  if (parts_.quotas.Take(p.pod, {{Quota::kQueuedBytes, sizeof(h) + h.frag_len}}) != 0)
    return Overflow(p);
  p.backlog_bytes += sizeof(h) + h.frag_len;
  std::vector<char> rec(sizeof(h) + h.frag_len);
  std::memcpy(rec.data(), &h, sizeof(h));
  std::memcpy(rec.data() + sizeof(h), payload, h.frag_len);
  p.backlog.push_back(std::move(rec));
  FlushBacklog(p);
}

void Forwarder::FlushBacklog(Proxy& p) {
  bool wrote = false;
  while (!p.backlog.empty()) {
    const std::vector<char>& rec = p.backlog.front();
    RecordHeader h;
    std::memcpy(&h, rec.data(), sizeof(h));
    const RingStatus st = AppendRecord(p.responses, h, rec.data() + sizeof(h), h.frag_len);
    if (st == RingStatus::kFull) break;
    if (st != RingStatus::kOk) {
      parts_.quotas.Give(p.pod, {{Quota::kQueuedBytes, p.backlog_bytes}});
      p.backlog_bytes = 0;
      p.backlog.clear();
      break;
    }
    const std::vector<char> done = std::move(p.backlog.front());
    p.backlog.pop_front();
    p.backlog_bytes -= done.size();
    parts_.quotas.Give(p.pod, {{Quota::kQueuedBytes, done.size()}});
    Delivered(p, done.data() + sizeof(RecordHeader));
    wrote = true;
  }
  if (!p.backlog.empty()) parts_.retry_soon();
  if (!wrote) return;
  p.responses.Publish();
  WakeOwner(p);
}

// READs and atomics leave the request ring only within the QP's kMaxRdAtomic and the pod's
// READ budget; one larger than the whole budget counts as the budget, so it goes alone.
bool Forwarder::AdmitRead(Proxy& p, const RequestView& v) {
  p.waiting_reads = false;
  if (v.h.kind != kRecReadReq && v.h.kind != kRecAtomicReq) return true;
  const uint64_t wanted = v.h.kind == kRecReadReq ? v.req.length : sizeof(uint64_t);
  const uint64_t bytes = std::min(wanted, parts_.quotas.limit(Quota::kReadBytes));
  if (p.reads.size() >= kMaxRdAtomic || !parts_.quotas.TryTake(p.pod, {Quota::kReadBytes, bytes})) {
    p.waiting_reads = true;
    parts_.retry_soon();
    return false;
  }
  p.reads.push_back({v.req.seq, bytes});
  return true;
}

// An answer reached the response ring: the READ or atomic it completes is no longer in
// flight, and a READ that waited for the budget may go.
void Forwarder::Delivered(Proxy& p, const char* payload) {
  if (p.reads.empty()) return;
  ProxyResponse r;
  std::memcpy(&r, payload, sizeof(r));
  if (!r.last || r.seq != p.reads.front().seq) return;
  parts_.quotas.Give(p.pod, {{Quota::kReadBytes, p.reads.front().bytes}});
  p.reads.pop_front();
  if (p.waiting_reads) Drain(p);
}

void Forwarder::ReleaseReads(Proxy& p) {
  for (const InFlightRead& r : p.reads) parts_.quotas.Give(p.pod, {{Quota::kReadBytes, r.bytes}});
  p.reads.clear();
  p.waiting_reads = false;
}

// The pod does not take its answers and the router holds no more for it: its QP fails.
void Forwarder::Overflow(Proxy& p) {
  parts_.quotas.Give(p.pod, {{Quota::kQueuedBytes, p.backlog_bytes}});
  p.backlog_bytes = 0;
  p.backlog.clear();
  if (!p.dead) MarkDead(p, proto::EventType::kPeerGone);
}

// Wakes the library if it waits in poll_cq, or sleeps on the QP's send CQ.
void Forwarder::WakeOwner(Proxy& p) {
  Pod* pod = parts_.tables.FindPod(p.pod);
  Qp* qp = parts_.tables.FindQp(p.qpn);
  if (pod == nullptr || qp == nullptr) return;
  pod->WakeProcess();
  // Outcomes of our own requests: never solicited completions.
  if (const WakeTarget cq = pod->CqWake(qp->send_cq_id)) WakeIfArmed(cq.slot, cq.fd, false);
  // Answers free READ slots: a READ (and what follows it) may wait for one in the library.
  RecordHeader h;
  const char* payload;
  if (p.requests.Peek(&h, &payload) == RingStatus::kEmpty) RoomMade(p);
}

// How far the library has published into the request ring.
uint64_t Forwarder::RequestsPublished(const Proxy& p) {
  return QpRing(p.seg.get(), kProxyRequestRing, kProxyRingBytes)->tail.load();
}

// Room was made that work requests of the library may wait for (QpSegmentHeader::
// sends_waiting): the request ring drained empty, or answers came back with nothing else
// published. Whether the library comes back for them by itself shows on the next tick.
void Forwarder::RoomMade(Proxy& p) {
  // Our release of the ring (or publish of answers) before the look at the word; the library
  // sets the word before it looks at the ring once more, so one of us sees the other.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (p.seg.as<QpSegmentHeader>()->sends_waiting.load(std::memory_order_relaxed) != kSendsWaiting)
    return;
  if (!p.nudge_due) parts_.retry_soon();
  p.nudge_due = true;
  p.published_then = RequestsPublished(p);
}

// A tick after RoomMade: a library that published since is busy (what it published is
// drained later, and room made again); one that did not may never call again (a program that
// waits on memory its peer writes), so its event thread advances its send queue.
void Forwarder::NudgeIfIdle(Proxy& p) {
  p.nudge_due = false;
  if (p.dead || RequestsPublished(p) != p.published_then) return;
  uint32_t waiting = kSendsWaiting;
  if (!p.seg.as<QpSegmentHeader>()->sends_waiting.compare_exchange_strong(waiting, kSendsNudged))
    return;
  ++nudges_;
  parts_.sessions.Notify(p.pod, proto::EventType::kProxyDrained, p.qpn);
}

Forwarder::Verdict Forwarder::OnMessage(LinkId link, const NodeMessage& m) {
  switch (m.type) {
    case wire::Type::kConnectReply: {
      wire::ConnectReply r;
      std::memcpy(&r, m.body, sizeof(r));
      Proxy* p = Find(link, m.chan);
      if (!wire::ValidConnectStatus(r.status)) {
        // Not passed on: the library would return it from ibv_modify_qp as an errno.
        if (p != nullptr && !p->connected) Finish(*p, EPROTO, nullptr);
        return Verdict::kMalformed;
      }
      if (p == nullptr || p->connected) return Verdict::kConsumed;
      if (const int rc = r.status == 0 ? CheckReply(*p, r) : 0) {
        // That connect fails; the link and its other channels are fine.
        spdlog::warn(
            "router {} answered the connect of QP {:#x} to QP {:#x} at {} with flags "
            "{:#x}, seal {}, port {}, connection {:#x}: {}",
            parts_.transport->PeerNode(link), p->qpn, p->dest_qpn, FormatIpv4(p->dest_ip), r.flags,
            r.seal, r.port, r.conn, rc == ECONNRESET ? "a connection that ended" : "refused");
        Finish(*p, rc, nullptr, true);
        return Verdict::kConsumed;
      }
      Finish(*p, r.status, &r);
      return Verdict::kConsumed;
    }
    case wire::Type::kResp: {
      RecordHeader h;
      const char* payload = nullptr;
      ResponseView v;
      if (!SplitRecord(m.body, m.len, &h, &payload) || !DecodeResponse(h, payload, &v))
        return Verdict::kMalformed;
      // A direct channel's answers go pod to pod: one that comes here is dropped, as for a
      // channel closed meanwhile.
      if (Proxy* p = Find(link, m.chan); p != nullptr && !p->direct) Deliver(*p, h, payload);
      return Verdict::kConsumed;
    }
    case wire::Type::kCredit:
      return OnCredit(link, m);
    case wire::Type::kPeerGone:
      if (Proxy* p = Find(link, m.chan)) {
        MarkDead(*p, m.flags != 0 ? proto::EventType::kPeerGone : proto::EventType::kPeerClosed);
      }
      return Verdict::kConsumed;
    default:
      return Verdict::kMalformed;  // requests travel the other way
  }
}

// The peer executed `bytes` more of the channel's records: the proxy may send that much more.
Forwarder::Verdict Forwarder::OnCredit(LinkId link, const NodeMessage& m) {
  wire::Credit c;
  std::memcpy(&c, m.body, sizeof(c));
  Proxy* p = Find(link, m.chan);
  if (p == nullptr) return Verdict::kConsumed;  // closed meanwhile
  if (c.bytes == 0 || c.bytes > p->in_flight) {
    spdlog::warn("router credited {} bytes to channel {}, which has {} in flight", c.bytes, m.chan,
                 p->in_flight);
    return Verdict::kMalformed;
  }
  const bool was_full = p->in_flight >= kChannelWindow;
  p->in_flight -= c.bytes;
  if (was_full && p->in_flight < kChannelWindow) Drain(*p);
  return Verdict::kConsumed;
}

void Forwarder::OnDrained(LinkId link) {
  for (auto& [chan, p] : proxies_)
    if (p->link == link) Drain(*p);
}

void Forwarder::OnLinkDown(LinkId link) {
  std::vector<uint32_t> chans;
  for (auto& [chan, p] : proxies_)
    if (p->link == link) chans.push_back(chan);
  for (uint32_t chan : chans) {
    auto it = proxies_.find(chan);
    if (it == proxies_.end()) continue;
    Proxy& p = *it->second;
    if (!p.connected) {
      Finish(p, EHOSTUNREACH, nullptr);
      continue;
    }
    // Outstanding and future work to that node fails: the QP goes to the error state.
    p.link = kNoLink;
    MarkDead(p, proto::EventType::kPeerGone);
  }
  if (!chans.empty())
    spdlog::warn("link {} down: failed {} cross-node channels", link, chans.size());
}

// The QP behind `p` is going away: what its library published and no round forwarded yet
// still goes, as a NIC transmits what was posted before the QP is destroyed (a UD send is
// complete for the program once posted: a process that exits right after must not lose
// it). READs and atomics do not: their answers would have nowhere to go.
void Forwarder::FlushOnClose(Proxy& p) {
  if (!p.connected || p.dead || p.direct || p.link == kNoLink) return;
  for (;;) {
    RecordHeader h;
    const char* payload = nullptr;
    if (p.requests.Peek(&h, &payload) != RingStatus::kOk) break;
    RequestView v;
    if (!DecodeRequest(h, payload, &v)) break;
    if (h.kind != kRecReadReq && h.kind != kRecAtomicReq)
      parts_.transport->Send(p.link, wire::Type::kRecord, p.chan, 0,
                             {{&h, sizeof(h)}, {payload, h.frag_len}});
    p.requests.Consume(h);
  }
}

void Forwarder::Drop(uint32_t chan, TellPeer tell, DropCause cause) {
  auto it = proxies_.find(chan);
  if (it == proxies_.end()) return;
  std::unique_ptr<Proxy> p = std::move(it->second);
  proxies_.erase(it);
  auto q = by_qp_.find(p->qpn);
  if (q != by_qp_.end()) {
    q->second.erase(chan);
    if (q->second.empty()) by_qp_.erase(q);
  }
  // Our kConnect left when the proxy was opened, so the peer has (or will have) a sender for
  // this channel; a peer that refused it ignores the close.
  if (tell == TellPeer::kYes && p->link != kNoLink) {
    FlushOnClose(*p);
    parts_.transport->Send(p->link, wire::Type::kClose, chan, cause == DropCause::kDied ? 1 : 0,
                           {});
  }
  ReleaseReads(*p);
  EndAsk(*p);
  parts_.quotas.Give(
      p->pod,
      {{Quota::kQueuedBytes, p->backlog_bytes}, {Quota::kProxies, 1}, {Quota::kFds, p->fds}});
  if (p->answer_pending) parts_.sessions.Answer(p->call, ECONNABORTED);
  loop_.Unwatch(p->doorbell_watch);
}

void Forwarder::DropQp(uint32_t qpn, bool died) {
  auto q = by_qp_.find(qpn);
  if (q == by_qp_.end()) return;
  const std::set<uint32_t> chans = q->second;
  for (uint32_t chan : chans) Drop(chan, TellPeer::kYes, CauseOf(died));
}

bool Forwarder::Tick() {
  const uint64_t now = MonotonicNs();
  if (!resolving_.empty()) RetryResolves(now);
  std::vector<uint32_t> expired, lost;
  for (auto& [chan, p] : proxies_) {
    if (p->ud && p->dead) {
      lost.push_back(chan);
      continue;
    }
    if (p->nudge_due) NudgeIfIdle(*p);
    if (!p->backlog.empty()) FlushBacklog(*p);
    // Doorbells can be missed only if the library died mid-publish; a slow sweep is cheap.
    if (p->connected && !p->dead) Drain(*p);
    if (!p->connected && p->answer_pending && now > p->connect_deadline_ns) expired.push_back(chan);
  }
  for (uint32_t chan : expired) {
    auto it = proxies_.find(chan);
    if (it != proxies_.end()) Finish(*it->second, ETIMEDOUT, nullptr);
  }
  for (uint32_t chan : lost)
    Drop(chan, TellPeer::kYes, DropCause::kClosed);  // a peer that closed it ignores kClose
  bool waiting = !resolving_.empty();
  for (auto& [chan, p] : proxies_)
    waiting |= !p->backlog.empty() || p->waiting_reads || p->nudge_due;
  return waiting;
}

bool Forwarder::Polling() const { return busy_until_ns_ != 0 && MonotonicNs() < busy_until_ns_; }

void Forwarder::NoteTraffic() {
  if (options_.poll_us != 0) busy_until_ns_ = MonotonicNs() + options_.poll_us * 1000ull;
}

bool Forwarder::PollAll() {
  bool moved = false;
  for (auto& [chan, p] : proxies_) {
    if (!p->connected || p->dead || p->direct) continue;
    RecordHeader h;
    const char* payload;
    if (p->requests.Peek(&h, &payload) == RingStatus::kOk) {
      Drain(*p);
      moved = true;
    } else if (!Polling()) {
      Drain(*p);  // arms the doorbell
    }
  }
  return moved;
}

}  // namespace ff::router
