// Initiator-side forwarding of cross-node traffic: a local QP's link to a QP on another
// node ("proxy").
//
// When a QP connects to an address that is not a pod of this node, the forwarder finds the
// address's node (Directory), opens a channel on the link to that node's router and, once
// the peer router accepts, answers the pod with a proxy segment (codec.h: the library
// produces requests into kProxyRequestRing; the forwarder writes the peer's answers into
// kProxyResponseRing) and a doorbell wake socket. Requests are forwarded in rounds of at most
// kForwardRoundBytes per proxy so that a long transfer on one QP does not starve the others;
// a congested link pauses its proxies until it drains, and a proxy with kChannelWindow bytes
// that the peer has not credited back (wire::Credit) pauses until it does. A connect to an address
// the control plane does not know yet waits up to --resolve-timeout-ms (a pod that just started).
//
// With --cross-node-path=direct, an RC/UC connect asks the peer router for a direct channel
// (wire::kConnectAskDirect, with the local process's token; docs/direct-path.md). A peer
// that gives one answers with the connection the two processes share (new: where to dial
// and its secret), and the library is answered kConnectDirect with no descriptors: the
// proxy then has no segment and forwards nothing, but stays for the channel's lifetime, so
// that kPeerGone, kClose and a link going down work as for a relayed channel. A peer that
// runs the relay answers without kReplyDirect: the proxy gets its segment then, as today.
// The reply's direct fields are checked (flags, seal, port, the connection it names): a
// reply that breaks them fails that connect with EPROTO, and one that names a connection
// of the two processes this router has forgotten (it ended meanwhile) with ECONNRESET;
// neither closes the link.
//
// Quotas (quotas.h), charged to the pod that owns the local QP: each proxy is one of its
// kProxies and, once it has a segment, two of its kFds. READs and atomics wait in the request ring,
// as on a requester HCA, while kMaxRdAtomic of the QP's or the pod's kReadBytes are in flight (a
// READ counts until its last answer reached the response ring). Answers that the response
// ring cannot take wait in a backlog charged to kQueuedBytes; a pod over it loses the QP
// (kPeerGone) instead of the router holding more for it.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <set>
#include <string>
#include <vector>

#include "base/event_loop.h"
#include "freeflow/codec.h"
#include "freeflow/ipv4.h"
#include "nodes/cross_node_parts.h"

namespace ff::router {

class LinkResume;

class Forwarder {
 public:
  using Verdict = NodeTransport::Handler::Verdict;
  struct Options {
    uint32_t poll_us = 0;             // poll proxies this long after the last traffic (0: sleep)
    uint32_t resolve_timeout_ms = 0;  // how long a connect waits for an unknown address
    Ipv4Prefix overlay;               // pod addresses (a peer's LID is its offset in it)
  };
  Forwarder(Options options, EventLoop& loop, CrossNodeParts parts)
      : options_(options), loop_(loop), parts_(std::move(parts)) {}
  ~Forwarder();

  // Connects local QP `src` to QP `dest_qpn` at overlay address `dest_ip` (host order) on
  // another node, and answers `call` (now on failure, else when the peer router replies).
  // An address no node is known for is waited for (--resolve-timeout-ms) unless `at_once`.
  void Connect(const Call& call, Qp& src, uint32_t dest_ip, uint32_t dest_qpn, bool ud,
               bool at_once = false);
  // Closes the channels of local QP `qpn`; the peer routers hear kClose (flags 1: died).
  void DropQp(uint32_t qpn, bool died);

  // kConnectReply, kResp and kPeerGone on a link this router dialled.
  Verdict OnMessage(LinkId link, const NodeMessage& m);
  void OnDrained(LinkId link);
  void OnLinkDown(LinkId link);
  // Waiting connects, answers waiting for ring space, missed doorbells, connect deadlines,
  // libraries that may not come back for room made (RoomMade). True while something waits
  // for a fast tick.
  bool Tick();

  // Polling mode (--poll-us): true while traffic flowed within the window.
  bool Polling() const;
  void NoteTraffic();
  // Drains every proxy once; true when anything moved. Arms doorbells once the window closed.
  bool PollAll();
  size_t proxies() const { return proxies_.size(); }
  size_t resolving() const { return resolving_.size(); }
  // kProxyDrained events sent since start: work requests the library had left waiting.
  uint64_t nudges() const { return nudges_; }
  // UD channels given up for a new one of the same pod at its quota, since start.
  uint64_t ud_links_recycled() const { return ud_links_recycled_; }

  // Across a router's replacement (link_resume.h; channel_resume.cc). Moves the direct,
  // connected channels on link `from` to `to` (a parked link, or the link that resumes
  // one) and says how many; the others stay for OnLinkDown.
  size_t Move(LinkId from, LinkId to);
  // The channels on `link`, and the peer address of one of them (0: none).
  std::vector<uint32_t> ChansOn(LinkId link) const;
  uint32_t AnyDestOn(LinkId link) const;
  // Fails channels `chans` on `link` as on a lost peer (kResumed named them: their targets
  // went while the link was down).
  void FailChans(LinkId link, const std::vector<uint32_t>& chans);
  // The hand-over (version 4): what keeps the channels from moving ("" when nothing does;
  // direct channels on ready links move, UD ones are given up), and the records. Import
  // parks each channel under the parked link of its node (`resume`).
  std::string WhyNotMovable(const NodeTransport& t) const;
  // Gives up every UD channel, as at a pod's quota (LoseUd): what its library published
  // still goes, and the library links again, to the successor, when it next sends there.
  void LoseUdLinks();
  nlohmann::json Export(const NodeTransport& t) const;
  void Import(const nlohmann::json& j, LinkResume& resume, uint64_t now);

 private:
  struct InFlightRead {
    uint32_t seq;    // the work request
    uint64_t bytes;  // charged to kReadBytes
  };
  struct Proxy {
    uint32_t chan = 0;
    PodId pod = 0;
    uint32_t qpn = 0;  // the local QP
    uint32_t dest_ip = 0;
    uint32_t dest_qpn = 0;
    LinkId link = kNoLink;
    UniqueFd seg_fd;
    Mapping seg;
    UniqueFd doorbell;     // receiving end of the doorbell wake socket: the router's
    UniqueFd doorbell_tx;  // sending end: the library's (and the router's own self-wake)
    EventLoop::WatchId doorbell_watch = 0;
    RingConsumer requests;
    RingProducer responses;
    std::deque<std::vector<char>> backlog;  // answers waiting for ring space (header + payload)
    uint64_t backlog_bytes = 0;             // charged to kQueuedBytes
    std::deque<InFlightRead> reads;         // forwarded READs/atomics, oldest first
    bool waiting_reads = false;             // a READ waits for the pod's budget
    bool nudge_due = false;       // room made while the library had sends waiting: next tick
    uint64_t published_then = 0;  // ... and the request ring's tail then
    uint64_t in_flight = 0;       // record bytes sent and not credited back
    bool connected = false;
    bool dead = false;  // the peer or the link went away: the library fails the QP
    bool ud = false;    // UD: a dead proxy is dropped on the next tick (the library links anew)
    bool answer_pending = false;
    bool ask_direct = false;  // the connect asked the peer for a direct channel
    bool asking = false;      // ... and has no answer yet (DirectConnections::Asking)
    bool direct = false;      // ... and got one: no segment, nothing forwarded
    uint64_t conn = 0;        // the direct connection the channel rides on
    uint64_t fds = 0;         // of the pod's kFds quota: the segment and the doorbell
    Call call;  // the ConnectQp to answer
    uint64_t connect_deadline_ns = 0;
  };
  struct PendingResolve {
    Call call;
    uint32_t qpn;
    uint32_t dest_ip;
    uint32_t dest_qpn;
    bool ud;
    uint64_t deadline_ns;
  };

  void Open(const Call& call, Qp& src, const cp::Endpoint& ep, uint32_t dest_ip, uint32_t dest_qpn,
            bool ud);
  int MakeSegment(Proxy& p);
  // The segment of a proxy that asked for a direct channel and was relayed after all.
  int MakeLateSegment(Proxy& p);
  // `peer_accepted`: the peer has a sender for the channel though the connect fails here
  // (a reply this router refuses): it hears kClose.
  void Finish(Proxy& p, int status, const wire::ConnectReply* reply, bool peer_accepted = false);
  // The ask for a direct channel of `p` is answered (or never will be).
  void EndAsk(Proxy& p);
  // The answer to the library for a direct channel (no descriptors).
  void AnswerDirect(Proxy& p, const wire::ConnectReply& reply);
  // What a successful reply says beyond its status, checked against what was asked and the
  // connections this router knows: 0, EPROTO (malformed) or ECONNRESET (a connection of
  // the two processes that ended here).
  int CheckReply(const Proxy& p, const wire::ConnectReply& r) const;
  Verdict OnCredit(LinkId link, const NodeMessage& m);
  void Drain(Proxy& p);
  static uint64_t RequestsPublished(const Proxy& p);
  void RoomMade(Proxy& p);
  void NudgeIfIdle(Proxy& p);
  void Deliver(Proxy& p, const RecordHeader& h, const char* payload);
  void FlushBacklog(Proxy& p);
  bool AdmitRead(Proxy& p, const RequestView& v);
  void Delivered(Proxy& p, const char* payload);
  void ReleaseReads(Proxy& p);
  void Overflow(Proxy& p);
  void WakeOwner(Proxy& p);
  void MarkDead(Proxy& p, proto::EventType event);
  // The kUdPeerLost event that tells the library of UD proxy `p` that its link is gone.
  static proto::Event UdLinkLost(const Proxy& p);
  void Drop(uint32_t chan, TellPeer tell, DropCause cause);
  // A UD link is a cache entry, as a UD QP on a NIC needs none: a pod at its quota of
  // channels gives up its oldest UD channel rather than have a new one refused.
  void MakeRoomForUd(uint32_t ip);
  // Drops UD proxy `chan` (what its library published still goes) and tells the library
  // (kUdPeerLost), which links again when it next sends there.
  void LoseUd(uint32_t chan);
  // Drops the UD proxies of local QP `qpn` to QP `dest_qpn` at `dest_ip` (a link the
  // library no longer has).
  void DropUdLinks(uint32_t qpn, uint32_t dest_ip, uint32_t dest_qpn);
  void FlushOnClose(Proxy& p);
  void RetryResolves(uint64_t now);
  Proxy* Find(LinkId link, uint32_t chan);

  Options options_;
  EventLoop& loop_;
  CrossNodeParts parts_;
  uint32_t next_chan_ = 1;
  uint64_t nudges_ = 0;
  uint64_t ud_links_recycled_ = 0;
  std::map<uint32_t, std::unique_ptr<Proxy>> proxies_;  // by channel
  std::map<uint32_t, std::set<uint32_t>> by_qp_;        // local QPN -> its channels
  std::vector<PendingResolve> resolving_;
  uint64_t busy_until_ns_ = 0;
};

}  // namespace ff::router
