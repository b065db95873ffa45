// Target-side execution of cross-node traffic: QPs on other nodes ("remote senders") that
// produce into QPs of this node, over links other routers dialled.
//
// A remote sender owns one ring of its target QP. Its records are executed in order against
// the target exactly as the library does on one node (core/target_ops.h): receive credits
// and RNR retries, records in the target's ring, MR checks against the target's table,
// direct access to its registered memory, atomics. The target process does nothing for
// WRITE, READ and ATOMIC. Every request gets one answer (kResp). A record that cannot
// proceed yet (no receive posted, ring full) waits with everything behind it and is retried
// by Retry() on the router's timer. Back-pressure is per channel: executed records are
// credited back to the initiator (wire::Credit), which keeps at most kChannelWindow bytes
// uncredited, so a target that never posts a receive or lags holds back only its own
// channel. A link is held (NodeTransport Verdict::kHold) only while the answers it owes its
// peer pile up; a READ's answers go out only while the link is not congested, the rest when
// it drained, so a long READ never piles up in the router.
//
// A connect names its initiator (source address and QPN); the source must be a pod of the
// node at the other end of the link, as the control plane says (with TLS, the node its
// certificate names): a router cannot speak for another node's pods. A source the control
// plane does not know yet is looked up again for kSourceResolveNs before the connect is
// refused (a pod that just started).
//
// A connect may ask for a direct channel (wire::kConnectAskDirect; docs/direct-path.md).
// With --cross-node-path=direct and an RC/UC target, after the same checks, the sender is
// direct: it holds its ring of the target QP for the channel's lifetime and executes
// nothing (the two processes exchange the records over their own connection; a kRecord for
// it is answered as for an unknown channel). The connection of the two processes is the one
// the router knows (DirectConnections), or a new one: a listener inside the owner's network
// namespace (DirectListeners) whose accepted socket goes to the owner with kDirectConn.
// The owner hears kDirectChannel before the reply leaves, and kDirectChannelGone when the
// sender is dropped. A connection that cannot be made (the owner's process at its bound of
// connections, no port free, its namespace not opened) relays the channel instead.
//
// Quotas (quotas.h), charged to the pod that owns the target QP: the router's mappings of
// its QP and SRQ segments and regions count against kMappedBytes (a connect over it gets
// ENOMEM, an access REM_ACCESS_ERR); records queued for it count against kQueuedBytes; its
// namespace handle and each listener its direct connections wait on, one kFds each. A
// target over that loses the connection: the request gets IBV_WC_RNR_RETRY_EXC_ERR and both
// sides hear the peer gone (a UD datagram is dropped, as on a fabric).
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <set>
#include <string>
#include <vector>

#include "base/reason_counts.h"
#include "freeflow/codec.h"
#include "freeflow/target_channel.h"
#include "freeflow/target_ops.h"
#include "nodes/cross_node_parts.h"

namespace ff::router {

class LinkResume;

// Why a connect from another router was refused (metrics: the `reason` label).
enum class ConnectRefusal : uint8_t {
  kMalformed,         // flags this version does not know, or a token without its flag
  kUnknownPod,        // a source the control plane does not know, after kSourceResolveNs
  kPodOfAnotherNode,  // a source that is a pod of another node than the link's
};
inline constexpr size_t kConnectRefusals = 3;
using ConnectRefusals = ReasonCounts<ConnectRefusal, kConnectRefusals>;

class Executor {
 public:
  using Verdict = NodeTransport::Handler::Verdict;
  explicit Executor(CrossNodeParts parts) : parts_(std::move(parts)) {}

  // kConnect, kRecord and kClose on a link another router dialled.
  Verdict OnMessage(LinkId link, const NodeMessage& m);
  void OnDrained(LinkId link);
  void OnLinkDown(LinkId link);
  // Stops remote sender `id` because its target QP goes away: its ring is freed and its
  // initiator hears kPeerGone (flags 1 when the target's process died).
  void ReleaseSender(uint32_t id, bool died);
  // Takes ring `ring` of UD QP `dest` from its sender, which is to send no more into it (the
  // ring goes to another sender, or `dest` goes away; `died`: its process died). A sender on
  // this node hears kUdPeerLost; one on another node has its channel closed by kPeerGone,
  // and its router tells its library the same. The ring is free afterwards.
  void LoseUdRing(Qp& dest, size_t ring, bool died);
  // LoseUdRing for a new sender of `dest`: counted when the ring had a sender.
  void TakeUdRing(Qp& dest, size_t ring);
  // Runs senders that wait for a receive or ring space. True while any still waits.
  bool Retry();
  size_t senders() const { return senders_.size(); }
  // UD rings taken from a sender for another since start (a QP hears kUdRingsPerQp at once).
  uint64_t ud_rings_taken() const { return ud_rings_taken_; }
  // Connects other routers sent that were refused, by reason, since start.
  const ConnectRefusals& refusals() const { return refusals_; }

  // Across a router's replacement (link_resume.h; channel_resume.cc). Moves the direct
  // senders on link `from` to `to` (a parked link) and says how many; the others stay for
  // OnLinkDown.
  size_t Move(LinkId from, LinkId to);
  size_t ChansOn(LinkId link) const;
  // kResume from the node whose parked link is `parked`, on `link`: the senders of the
  // listed channels move to `link`, the other parked ones are dropped (their initiators
  // went meanwhile: their targets fail as on a lost peer), and *missing gets the listed
  // channels that have no parked sender.
  void Resume(LinkId parked, LinkId link, const std::vector<uint32_t>& chans,
              std::vector<uint32_t>* missing);
  // The hand-over (version 4), as Forwarder's.
  std::string WhyNotMovable() const;
  // Drops every UD sender (datagrams queued for a full ring are lost, as on a fabric); its
  // initiator hears kPeerGone and links again when it next sends.
  void LoseUdSenders();
  nlohmann::json Export(const NodeTransport& t) const;
  void Import(const nlohmann::json& j, LinkResume& resume, uint64_t now);

 private:
  struct Sender {
    uint32_t id = 0;
    LinkId link = kNoLink;
    uint32_t chan = 0;
    uint32_t src_ip = 0;  // the initiator, host byte order
    uint32_t src_qpn = 0;
    uint32_t target_qpn = 0;
    uint32_t recv_cq_id = 0;
    PodId owner = 0;               // the target QP's pod
    const QpKind* kind = nullptr;  // the target QP's
    Mapping seg;
    Mapping ud_ring;  // UD: the ring of this sender's own the router made
    TargetChannel target;  // executes its records (core/target_channel.h)
    bool direct = false;  // records go pod to pod on connection `conn`; none come here
    uint64_t conn = 0;
    std::deque<std::vector<char>> queue;  // records not executed yet, in order
    Held queued;                          // their bytes, of the target pod's kQueuedBytes
    Held mapped;                          // the target's segments mapped for this sender
    uint64_t uncredited = 0;              // executed record bytes not credited yet
    // UD: its initiator closed the channel while records waited here (CloseSender); it goes
    // once they are in the target's ring, or at close_deadline_ns.
    bool closing = false;
    bool close_died = false;
    uint64_t close_deadline_ns = 0;
  };
  struct TargetHost;  // what TargetChannel asks of the router (executor.cc)
  // A connect looked at again on the router's timer: its source address the control plane
  // did not know yet, or a crossed ask (WaitsForCrossedAsk).
  struct Unresolved {
    LinkId link;
    uint32_t chan;
    wire::Connect m;
    uint64_t deadline_ns;
    uint64_t crossed_ns;
  };
  using Key = std::pair<LinkId, uint32_t>;  // (link, channel)

  // `deadline_ns`: until when an unknown source is looked up again; `crossed_ns`: until when
  // a crossed ask waits (0: a fresh connect).
  void Connect(LinkId link, uint32_t chan, const wire::Connect& m, uint64_t deadline_ns = 0,
               uint64_t crossed_ns = 0);
  void RetryUnresolved();
  // Direct channels (executor_direct.cc). True when `m` asks for one (for a QP of any type)
  // and this router gives them.
  bool WantsDirect(const wire::Connect& m) const;
  // The connection of the initiator's process with `owner`'s: one the router knows, or a new
  // one whose listener is open; its fields go into *reply. false: none (relay the channel).
  bool DirectConn(const wire::Connect& m, Pod& owner, wire::ConnectReply* reply);
  // True when `m`, a direct ask to a QP of `owner`, crossed an ask of `owner` to the
  // initiator's pod that is not answered yet, and this router is the one that waits for
  // that answer (its pod's address is the lower), at most until *until (set on the first
  // look, kDirectCrossedWaitNs on). DirectConnections says why.
  bool WaitsForCrossedAsk(const wire::Connect& m, const Pod& owner, uint64_t* until) const;
  // The owner's network namespace for its listeners (-1: the router's own), opened on first
  // use. 0 or an errno value, with *error.
  int OwnerNetns(Pod& owner, int* fd, std::string* error);
  // A listener of connection `conn` of `pod` ended: its socket goes to the pod (kDirectConn),
  // or the connection is forgotten.
  void DirectAccepted(PodId pod, uint64_t conn, uint32_t dialler_ip,
                      const std::array<uint8_t, kDirectSecretBytes>& secret, UniqueFd sock,
                      int error);
  // Tells the owner of direct sender `s`'s target which channel goes to it (kDirectChannel,
  // with `ud_ring`, the memfd of the ring of its own a UD channel produces into, or -1) or
  // that it is closed (kDirectChannelGone).
  void TellChannel(const Sender& s, uint32_t ring, PodId owner, bool gone, int ud_ring);
  // A relayed sender's mappings of target QP `dest` of `owner` and its ring `ring` (UD:
  // one of its own). 0 or the errno the connect is answered with.
  int MapTarget(Sender& s, Qp& dest, Pod& owner, const wire::Connect& m, uint32_t ring);
  // A UD sender's ring of its own, `ring` of `dest` (the sender that held it loses it), and
  // the owner told whose it is (kUdRing). 0 or the errno the connect is answered with.
  int NewUdRingFor(Qp& dest, Pod& owner, const wire::Connect& m, uint32_t ring);
  Verdict Record(LinkId link, uint32_t chan, const char* body, uint32_t len);
  // Executes one request (TargetChannel, with the target's pod as its host). false: it
  // cannot proceed yet (retry later).
  bool Apply(Sender& s, const RequestView& v);
  const Mapping* MapRegion(Pod& owner, uint32_t region, uint32_t need);
  Verdict Overflow(Sender& s, const RequestView& v);
  void RunWaiting(LinkId link);  // kNoLink: on every link
  void Respond(LinkId link, uint32_t chan, uint32_t seq, uint32_t status, uint64_t offset,
               const char* data, uint32_t len, bool last);
  void Publish(Sender& s);  // makes executed records visible and wakes the target
  void Run(Sender& s);      // executes queued records
  // The initiator closed the sender's channel: dropped now, or once its queued UD
  // datagrams are in the target's ring.
  void CloseSender(Sender& s, bool died);
  // `bytes` of the sender's records are done with: credits them back in batches.
  void Credit(Sender& s, uint64_t bytes);
  void Drop(Key key, TellPeer tell, DropCause cause);
  // Moves the sender at `key` to link `to`, same channel (channel_resume.cc).
  void Rekey(const Key& key, LinkId to);
  Sender* Find(LinkId link, uint32_t chan);

  CrossNodeParts parts_;
  uint32_t next_id_ = 1;
  uint64_t ud_rings_taken_ = 0;
  ConnectRefusals refusals_{{"malformed", "unknown_pod", "pod_of_another_node"}};
  std::map<Key, std::unique_ptr<Sender>> senders_;
  std::map<uint32_t, Key> by_id_;
  std::set<Key> waiting_;             // senders with queued records
  std::set<LinkId> held_for_output_;  // links held because their answers pile up
  std::vector<Unresolved> unresolved_;
};

}  // namespace ff::router
