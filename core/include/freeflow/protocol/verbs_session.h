// A verbs session (libffverbs.so) on the pod socket: HELLO, the requests that make, connect
// and destroy the process's objects (channels, CQs, SRQs, QPs, registrations, windows),
// their answers, and the events the router sends on the event socket. Requests are checked
// against kOpSpecs (pod_socket.h); contracts and the ABI rule are in docs/protocol.md.
#pragma once

#include <cstddef>
#include <cstdint>

#include "freeflow/abi_constants.h"
#include "freeflow/protocol/common.h"

namespace ff::proto {

// fds: [notify segment memfd, event socket, wake socket]. The last notify slot
// (kWakeSlot) is the process's wake word: a router that delivers cross-node data to the
// process sends on the wake socket when the word is armed. CQs use the slots below it.
// Every memfd a pod hands over must be sealed against shrinking (SealedAtLeast, fd.h);
// every fd the router or a peer wakes through is the sending end of a wake socket (fd.h),
// never an eventfd: nothing a pod holds can make its waker block.
inline constexpr uint32_t kWakeSlot = kNotifySlots - 1;
static_assert(kWakeSlot == kNotifySlots - 1 && kWakeSlot > 0, "the wake word is the last slot");
using Hello = HelloOf<Op::kHello>;

// The requests that name one object of the pod by its id, and carry nothing else.
template <Op kOpValue>
struct ObjectRequest {
  RequestHeader<kOpValue> h;
  uint32_t id;  // the channel, CQ or SRQ id the library chose; a QPN the router assigned
  uint32_t reserved;
};
using CreateChannel = ObjectRequest<Op::kCreateChannel>;  // fds: [channel wake socket]
using DestroyChannel = ObjectRequest<Op::kDestroyChannel>;
using DestroyCq = ObjectRequest<Op::kDestroyCq>;
using CreateSrq = ObjectRequest<Op::kCreateSrq>;  // fds: [SRQ segment memfd]
using DestroySrq = ObjectRequest<Op::kDestroySrq>;
using DestroyQp = ObjectRequest<Op::kDestroyQp>;
using DisconnectQp = ObjectRequest<Op::kDisconnectQp>;  // forget the QP's peer (at RESET)
static_assert(sizeof(CreateChannel) == 16 && sizeof(DestroyChannel) == 16 &&
              sizeof(DestroyCq) == 16 && sizeof(CreateSrq) == 16 && sizeof(DestroySrq) == 16 &&
              sizeof(DestroyQp) == 16 && sizeof(DisconnectQp) == 16 && alignof(CreateChannel) == 4);

struct CreateCq {
  RequestHeader<Op::kCreateCq> h;
  uint32_t cq_id;
  uint32_t notify_slot;  // kNoId when the CQ has no completion channel
  uint32_t chan_id;      // kNoId likewise
  uint32_t reserved;
};
static_assert(sizeof(CreateCq) == 24 && alignof(CreateCq) == 4);
// fds: [QP segment memfd]
// `qpn` 0: the router numbers the QP and answers (CreateQpReply). Otherwise one of the
// numbers the router granted this session for RC/UC QPs (CreateQpReply::grant): such a
// create may be posted, as what the answer would say (the number) is known. A refusal of
// a posted create is only logged, and the number is then no QP's.
struct CreateQp {
  RequestHeader<Op::kCreateQp> h;
  uint32_t qp_type;  // ibv_qp_type
  uint32_t num_rings;
  uint32_t ring_bytes;
  uint32_t srq_id;  // kNoId when none
  uint32_t recv_cq_id;
  uint32_t send_cq_id;
  uint32_t qpn;  // 0, or a granted number
  uint32_t reserved;
};
static_assert(sizeof(CreateQp) == 40 && alignof(CreateQp) == 4);
// A QP and the peer it addresses, by overlay IPv4 (GID) when dest_ip != 0, else by LID:
//   ConnectQp  connects local `qpn` (RC/UC, at RTR; op kConnectQp) or resolves a UD
//              destination (op kResolveUd): the sender is given one ring of the destination
//              QP to produce into. A connect to an address no node is known for yet waits
//              up to --resolve-timeout-ms (a pod that just started), except a UD resolve
//              with kResolveAgain: the library was refused that destination before, and a
//              datagram is dropped at once rather than held in ibv_post_send.
//   NameQp     RC/UC `qpn` names its peer, as ConnectQp does, and nothing is linked: what
//              the library posts at a passive rdma_cm side's RTR, whose peer cannot have
//              named it yet. Its link is made when first needed (ConnectQp). A QP of this
//              node that named `qpn` first, and asked (its ConnectQp answered
//              EINPROGRESS), is told it may link now (kPeerNamed).
// Consent: an RC/UC QP names its peer here, and a ring of an RC/UC QP is given only to the
// QP it named. Until the destination names `qpn` ConnectQp's answer is EINPROGRESS (with no
// descriptors): the QP is at RTR, and the library asks again when it first needs the link.
template <Op kOpValue>
struct QpPeer {
  RequestHeader<kOpValue> h;
  uint32_t qpn;
  uint32_t dest_ip;  // network byte order, 0 when addressing by LID
  uint32_t dest_qpn;
  uint16_t dest_lid;
  uint16_t flags;  // ResolveUd: kResolveAgain; else 0
};
inline constexpr uint16_t kResolveAgain = 1;
using ConnectQp = QpPeer<Op::kConnectQp>;
using NameQp = QpPeer<Op::kNameQp>;
static_assert(sizeof(ConnectQp) == 24 && sizeof(NameQp) == 24 && alignof(ConnectQp) == 4);

inline constexpr uint32_t kNoRegion = 0;  // a registration without remote access has none
// Registrations share one layout; each op uses the fields marked with it. fds: [region
// memfd] when new_region != 0. MoveMr moves a live registration to another region (the
// library merged overlapping registrations into one memfd); its key stays the same.
// Only a registration with a remote access flag has a region: the others name kNoRegion
// and their memory never leaves the process. A region whose registrations grant no remote
// write or atomic must be sealed read-only (SealReadOnly) before a peer may map it.
template <Op kOpValue>
struct MrRequest {
  RequestHeader<kOpValue> h;
  uint64_t addr;           // Reg: the registration's first address (its iova)
  uint64_t length;         // Reg
  uint64_t region_offset;  // Reg, Move: where the registration starts in its region
  uint64_t region_size;    // Reg, Move: the region's size
  uint32_t access;         // Reg: ibv_access_flags
  uint32_t key;            // Dereg, Move
  uint32_t region_id;      // Reg, Move
  uint32_t new_region;     // Reg, Move: the region's memfd comes with this request
  uint32_t release;        // Dereg, Move: the region the entry named before is no longer used
  uint32_t pd;             // Reg: its protection domain (MrEntry::pd)
};
using RegMr = MrRequest<Op::kRegMr>;
using DeregMr = MrRequest<Op::kDeregMr>;
using MoveMr = MrRequest<Op::kMoveMr>;
static_assert(sizeof(RegMr) == 64 && sizeof(DeregMr) == 64 && sizeof(MoveMr) == 64 &&
              alignof(RegMr) == 8);
// Memory windows share one layout; each op uses the fields marked with it. A window is an
// entry of the MR table (its key names it) that AllocMw publishes unbound (no range, no
// rights) in the protection domain AllocMw names. BindMw points it at part of a live
// registration of the pod of the same domain that allows IBV_ACCESS_MW_BIND and has a
// region, with rights of its own (writes and atomics need the registration's local write),
// and gives it `new_key` (same slot); length 0 unbinds. InvalidateMw unbinds a bound type 2
// window (LOCAL_INV; with qpn != 0, a SEND_WITH_INV received on that QP, which must be the
// window's). The reply to AllocMw carries the key in reg_mr.key.
template <Op kOpValue>
struct MwRequest {
  RequestHeader<kOpValue> h;
  uint64_t addr;     // Bind: the window's first address (iova of the registration)
  uint64_t length;   // Bind
  uint32_t key;      // Bind, Invalidate, Dealloc: the window's current key
  uint32_t new_key;  // Bind
  uint32_t mr_key;   // Bind: the registration it is bound to
  uint32_t access;   // Bind: remote rights (ibv_access_flags)
  uint32_t qpn;      // Bind: type 2, the QP it is bound through (0: type 1); Invalidate
  uint32_t type;     // Alloc: ibv_mw_type
  uint32_t pd;       // Alloc: its protection domain (MrEntry::pd)
  uint32_t reserved;
};
using AllocMw = MwRequest<Op::kAllocMw>;
using BindMw = MwRequest<Op::kBindMw>;
using InvalidateMw = MwRequest<Op::kInvalidateMw>;
using DeallocMw = MwRequest<Op::kDeallocMw>;
static_assert(sizeof(AllocMw) == 56 && sizeof(BindMw) == 56 && sizeof(InvalidateMw) == 56 &&
              sizeof(DeallocMw) == 56 && alignof(AllocMw) == 8);
// Asks for the memfd of a region of the RC/UC peer connected to `qpn` (the peer named
// `qpn`, and `qpn` named it); never of a UD destination.
struct GetRegion {
  RequestHeader<Op::kGetRegion> h;
  uint32_t qpn;
  uint32_t region_id;
};
static_assert(sizeof(GetRegion) == 16 && alignof(GetRegion) == 4);

// ---- answers (Response::u, pod_socket.h) ---------------------------------------------------
// The answer to a HELLO, and to a socket session's SockHello (tcp_mode.h).
struct HelloReply {
  uint32_t ctx_id;
  uint32_t ip;  // overlay IPv4, network byte order
  uint16_t lid;
  uint16_t reserved;
  uint32_t prefix_len;
  char node[128];  // node name, or on refusal the reason
};
static_assert(sizeof(HelloReply) == 144 && alignof(HelloReply) == 4);
static_assert(offsetof(HelloReply, node) == 16,
              "a refusal's reason stays where every version reads it");
// An answered create also carries the session's QP numbers for posted RC/UC creates: the
// whole list, which replaces the one the library kept (requests are handled in order, so
// the router has seen every posted create before it answers). The router grants numbers
// while the pod is far from its quotas; a posted create it refuses all the same is
// reported as kQpRefused for that number.
inline constexpr uint32_t kQpnGrant = 8;
struct CreateQpReply {
  uint32_t qpn;
  uint32_t grant_count;  // at most kQpnGrant
  uint32_t grant[kQpnGrant];
};
static_assert(sizeof(CreateQpReply) == 40 && alignof(CreateQpReply) == 4);
// fds: [peer QP segment, peer notify segment, peer MR table, peer channel wake socket (when
// notify_slot != kNoId), peer SRQ segment (when has_srq)]
// A peer on another node is reached through a proxy segment owned by the router:
// flags has kConnectRemote and fds are [proxy segment, doorbell wake socket]; the roles of its
// two rings are kProxyRequestRing and kProxyResponseRing (codec.h).
// A UD destination on this node gives each sender a ring of its own: flags has
// kConnectOwnRing and one more fd follows, a router-made memfd of UdRingBytes(ring_bytes)
// (shm_layout.h) to produce into, instead of ring `ring_index` of the peer's segment. No
// sender ever maps another sender's ring, and the receiver learns who produces into it from
// the router (kUdRing), never from the records.
// A peer on another node reached over a direct connection between the two processes
// (docs/direct-path.md) has flags kConnectDirect and no descriptors: the QP's requests go as
// records of channel `direct_chan` on connection `direct_conn` to the peer process. With
// kConnectDirectNew as well the library has no such connection yet: it dials
// (peer_ip, direct_port) from its own network namespace, and its first frame is the Hello
// sealed with `direct_secret` (direct_wire.h); `direct_seal` is the SealMode both ends use.
inline constexpr uint16_t kConnectRemote = 1, kConnectOwnRing = 2;  // ConnectReply::flags
inline constexpr uint16_t kConnectDirect = 4, kConnectDirectNew = 8;
struct ConnectReply {
  uint32_t peer_ctx_id;
  uint32_t peer_qpn;
  uint32_t peer_ip;
  uint16_t peer_lid;
  uint16_t flags;
  uint32_t ring_index;
  uint32_t num_rings;
  uint32_t ring_bytes;
  uint32_t notify_slot;
  uint32_t has_srq;
  uint32_t peer_qp_type;
  // kConnectDirect only.
  uint32_t direct_chan;
  uint16_t direct_port;
  uint8_t direct_seal;
  uint8_t reserved;
  uint64_t direct_conn;
  uint8_t direct_secret[32];
};
static_assert(sizeof(ConnectReply) == 88 && alignof(ConnectReply) == 8);
struct RegMrReply {
  uint32_t key;
  uint32_t reserved;
};
static_assert(sizeof(RegMrReply) == 8 && alignof(RegMrReply) == 4);
// fds: [region memfd]. writable == 0: map it read-only (it is sealed so; its registrations
// grant reads only).
struct GetRegionReply {
  uint64_t size;
  uint32_t writable;
  uint32_t reserved;
};
static_assert(sizeof(GetRegionReply) == 16 && alignof(GetRegionReply) == 8);

// Router -> library notifications, on the event socket handed over at HELLO.
enum class EventType : uint32_t {
  kPeerGone = 1,    // the peer of `qpn` died (process, router or node): fail the QP
  kShutdown = 2,    // the router is stopping
  kPeerClosed = 3,  // the peer of `qpn` destroyed its QP: later sends fail, receives stay
  // UD QP `qpn` has a new sender in `ring`: QP src_qpn at src_ip (host order), producing
  // into the memfd that comes with the event (UdRingBytes). Everything read from that ring
  // is from that sender, whatever its records claim.
  kUdRing = 4,
  // The peer that RC/UC QP `qpn` named has now named it in turn (and produces into it): a
  // connect that was answered EINPROGRESS succeeds if asked again. Only a QP that asked is
  // told, so as not to wake a process that needs nothing.
  kPeerNamed = 5,
  // The router drained the request ring of RC/UC/UD QP `qpn`'s proxy (or delivered its
  // answers) while the library had marked work requests waiting for it
  // (QpSegmentHeader::sends_waiting): the library advances the QP's send queue now.
  kProxyDrained = 6,
  // The router refused the posted create of `qpn` (CreateQp under a granted number): there
  // is no such QP, and the library fails the one it made.
  kQpRefused = 7,
  // UD QP `qpn` lost its link to the UD QP src_qpn at src_ip (host order; here the
  // destination, not a source): that QP's ring went to another sender (it hears at most
  // kUdRingsPerQp at once), or the QP, its process or its node went away. What the library
  // writes into the old ring is lost, as datagrams are on a fabric; it drops the link, and
  // its next datagram to that QP asks for a new one.
  kUdPeerLost = 8,
  // Direct connections (docs/direct-path.md). kDirectChannel: records of channel `chan` on
  // connection `conn` from QP src_qpn at src_ip (host order) go to QP `qpn`, into its ring
  // `ring` (the router gave that ring to this channel). For a UD QP the ring is a sender's
  // own (kUdRing for it came first) and its memfd comes with this event: the library
  // produces the channel's datagrams into it. Sent before the initiator can send a record on
  // it. kDirectChannelGone: channel `chan` of `conn` is closed; records that still come for
  // it are refused as for a QP that is gone. kDirectConn: the connection `conn` from the
  // process at src_ip, accepted by the router inside this pod, comes with the event as a
  // connected TCP socket whose first frame (the dialler's Hello) the router consumed;
  // `secret` and `seal` (SealMode) are the connection's; this end is its acceptor.
  kDirectChannel = 9,
  kDirectChannelGone = 10,
  kDirectConn = 11,
};
struct Event {
  EventType type;
  uint32_t qpn;
  uint32_t ring = 0;
  uint32_t src_ip = 0;
  uint32_t src_qpn = 0;
  uint32_t chan = 0;  // kDirect*
  uint64_t conn = 0;  // kDirect*
  uint32_t seal = 0;  // kDirectConn
  uint32_t reserved = 0;
  uint8_t secret[32] = {};  // kDirectConn
};
static_assert(sizeof(Event) == 72 && alignof(Event) == 8);

// Posted by a library whose direct connection `conn` ended (the peer closed it, a frame did
// not open, the dial failed: `error`, an errno value): the router forgets it, so that the
// next connect between the two processes makes a new one, and logs the first failure of a
// dial (a pod network that refuses the connection).
struct DirectEnded {
  RequestHeader<Op::kDirectEnded> h;
  uint32_t error;
  uint32_t reserved;
  uint64_t conn;
};
static_assert(sizeof(DirectEnded) == 24 && alignof(DirectEnded) == 8);

// Posted once, after HELLO: the session's traffic ledger (traffic_ledger.h), which the library
// writes and the router only reads. fds: [ledger memfd, sealed against shrinking, `bytes`
// (kTrafficLedgerBytes) long]. A router that refuses it (a second one, another size) only
// logs it: the session works the same, uncounted.
struct TrafficLedger {
  RequestHeader<Op::kTrafficLedger> h;
  uint32_t bytes;
  uint32_t reserved;
};
static_assert(sizeof(TrafficLedger) == 16 && alignof(TrafficLedger) == 4);

// How many descriptors come with a successful ConnectReply, or -1 when its fields do not
// describe a segment a library may map.
inline int ConnectReplyFds(const ConnectReply& c) {
  if (c.flags & kConnectDirect) return (c.flags & (kConnectRemote | kConnectOwnRing)) ? -1 : 0;
  if (c.ring_bytes < kMinRingBytes || c.ring_bytes > kMaxRingBytes ||
      (c.ring_bytes & (c.ring_bytes - 1)) != 0)
    return -1;
  if (c.flags & kConnectRemote) return c.num_rings == 2 && c.ring_index == 0 ? 2 : -1;
  if (c.num_rings == 0 || c.num_rings > kMaxRingsPerQp || c.ring_index >= c.num_rings) return -1;
  if (c.notify_slot != kNoId && c.notify_slot >= kWakeSlot) return -1;
  return 3 + (c.notify_slot != kNoId ? 1 : 0) + (c.has_srq ? 1 : 0) +
         ((c.flags & kConnectOwnRing) ? 1 : 0);
}

}  // namespace ff::proto
