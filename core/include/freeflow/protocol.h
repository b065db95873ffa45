// Messages between the container library and the router, over a SOCK_SEQPACKET Unix
// socket (one message per datagram, file descriptors as SCM_RIGHTS), or, once a verbs
// session has handed over its request ring (RequestRing below), as records in that ring. Every
// message is a fixed-size POD: the router rejects any size, op or descriptor count it does not
// expect (kOpSpecs, checked by DecodeRequest) and disconnects the sender. Requests are answered in
// order with a Response whose status is 0 or a positive errno value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "freeflow/tunables.h"

namespace ff {
// Version of the router <-> library protocol, of the shared-memory layouts and of the proxy
// records: a library and a router with different values refuse each other at HELLO.
inline constexpr uint32_t kAbiVersion = 14;
}  // namespace ff

namespace ff::proto {

enum class Op : uint32_t {
  kHello = 1,
  kCreateChannel,
  kDestroyChannel,
  kCreateCq,
  kDestroyCq,
  kCreateSrq,
  kDestroySrq,
  kCreateQp,
  kDestroyQp,
  kConnectQp,
  kDisconnectQp,
  kResolveUd,
  kRegMr,
  kDeregMr,
  kGetRegion,
  kMoveMr,
  kAllocMw,
  kBindMw,
  kInvalidateMw,
  kDeallocMw,
  kCmOpenChannel,
  kCmCommand,
  // TCP mode (libfsocket.so): a socket session says kSockHello instead of kHello and may
  // then send only the kSock* requests below; a verbs session may send none of them.
  kSockHello,
  kSockListen,
  kSockUnlisten,
  kSockConnect,
  kSockClaim,
  kSockRelease,
  kSockClosed,
  kNameQp,
  kRequestRing,
  kDoorbell,
  kMaxOp,
};

struct Header {
  Op op;
  uint32_t seq;  // echoed in the response
};

// The header of a request of one kind: a value-initialised request names its op, and
// OpOf<M> tells it at compile time. Same layout as Header.
template <Op kOpValue>
struct RequestHeader {
  static constexpr Op kOp = kOpValue;
  Op op = kOpValue;
  uint32_t seq = 0;
};
static_assert(sizeof(RequestHeader<Op::kHello>) == sizeof(Header));
template <typename M>
inline constexpr Op OpOf = decltype(M::h)::kOp;

inline constexpr uint32_t kNoId = 0xffffffffu;
// A request with this seq is posted: the router answers none (see IsPostable below). The library
// numbers its other requests from 1 and skips it.
inline constexpr uint32_t kPostedSeq = 0xffffffffu;
inline constexpr uint32_t kNoRegion = 0;  // a registration without remote access has none

// fds: [notify segment memfd, event socket, wake socket]. The last notify slot
// (kWakeSlot) is the process's wake word: a router that delivers cross-node data to the
// process sends on the wake socket when the word is armed. CQs use the slots below it.
// Every memfd a pod hands over must be sealed against shrinking (SealedAtLeast, fd.h);
// every fd the router or a peer wakes through is the sending end of a wake socket (fd.h),
// never an eventfd: nothing a pod holds can make its waker block.
inline constexpr uint32_t kWakeSlot = kNotifySlots - 1;
static_assert(kWakeSlot == kNotifySlots - 1 && kWakeSlot > 0, "the wake word is the last slot");
struct Hello {
  RequestHeader<Op::kHello> h;
  uint32_t abi;
  uint32_t reserved;
};

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

struct CreateCq {
  RequestHeader<Op::kCreateCq> h;
  uint32_t cq_id;
  uint32_t notify_slot;  // kNoId when the CQ has no completion channel
  uint32_t chan_id;      // kNoId likewise
  uint32_t reserved;
};
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

// The request ring of a verbs session (shm_layout.h), handed over once after HELLO. fds:
// [ring memfd, sealed against shrinking, RequestRingSegmentBytes(bytes) long]; `bytes` is
// kRequestRingBytes. From the answer on, the library writes each request as one
// kRecRequest record (the request's bytes, header included) instead of sending it. A
// request with descriptors still travels on the socket, right after a kRecOnSocket record
// (no payload) that holds its place: the router serves the ring in order and takes such a
// request from the socket when it reaches its record. While the router sleeps it sets
// RequestRingControl::sleeping; a library that finds it set after publishing takes it back
// to 0 and sends a Doorbell. A router that refuses the ring (or predates it) leaves the
// library on the socket. Requests are answered on the socket as before. Only a Doorbell,
// or a request whose kRecOnSocket record is published, may come on the socket after it.
struct RequestRing {
  RequestHeader<Op::kRequestRing> h;
  uint32_t bytes;
  uint32_t reserved;
};
// Posted: the ring has records (RequestRing). Nothing else.
struct Doorbell {
  RequestHeader<Op::kDoorbell> h;
  uint32_t reserved[2];
};
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
  uint32_t reserved;
};
using RegMr = MrRequest<Op::kRegMr>;
using DeregMr = MrRequest<Op::kDeregMr>;
using MoveMr = MrRequest<Op::kMoveMr>;
// Memory windows share one layout; each op uses the fields marked with it. A window is an
// entry of the MR table (its key names it) that AllocMw publishes unbound (no range, no
// rights). BindMw points it at part of a live registration of the pod that allows
// IBV_ACCESS_MW_BIND and has a region, with at most that registration's remote rights, and
// gives it `new_key` (same slot); length 0 unbinds. InvalidateMw unbinds a bound type 2
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
};
using AllocMw = MwRequest<Op::kAllocMw>;
using BindMw = MwRequest<Op::kBindMw>;
using InvalidateMw = MwRequest<Op::kInvalidateMw>;
using DeallocMw = MwRequest<Op::kDeallocMw>;
// Asks for the memfd of a region of the RC/UC peer connected to `qpn` (the peer named
// `qpn`, and `qpn` named it); never of a UD destination.
struct GetRegion {
  RequestHeader<Op::kGetRegion> h;
  uint32_t qpn;
  uint32_t region_id;
};

// rdma_cm. The library serves /dev/infiniband/rdma_cm in the process (librdmacm's kernel
// device, the ucma ABI of <rdma/rdma_user_cm.h>) and the router is its kernel: it keeps
// the ids, the ports and the connections, and queues the events.
// A channel is one open of the device: the library makes a SOCK_SEQPACKET socketpair,
// keeps one end as the descriptor the program sees, and hands the other to the router with
// CmOpenChannel. The router writes the channel's events there (CmEvent, one per
// datagram), so the program's poll/epoll and O_NONBLOCK work on it as on the kernel's
// device. When the program closes its end the router destroys the channel's ids.
// The library keeps a copy of the router's end too: it writes there the events of the
// commands it answers itself (ROUTE_RESOLVED of a posted RESOLVE_ROUTE, below). So a
// channel the router drops is shut down (shutdown(2)) before it is closed, and the library
// shuts its copies down when it loses the router: either way the program reads EOF, which
// the library turns into DEVICE_REMOVAL.
// fds: [the router's end of the channel socket]
struct CmOpenChannel {
  RequestHeader<Op::kCmOpenChannel> h;
  uint32_t channel;  // chosen by the library, unique in the session
  uint32_t reserved;
};
// One ucma command written to `channel`, as the program wrote it after its
// rdma_ucm_cmd_hdr: `in_len` bytes of `body` (the rest zero). Pointers in it mean nothing
// to the router: it never writes to the program's memory; the library copies the answer
// (CmReply) to the command's `response`. The library rewrites two fields before sending:
// MIGRATE_ID's `fd` becomes the channel id of that descriptor (kNoId when it is not an
// rdma_cm descriptor of this process), and SET_OPTION's option value follows its struct
// in `body` (optval ignored). GET_EVENT never comes here: the library reads the channel.
// A posted RESOLVE_ROUTE (kPostedSeq) resolves the route without an event: the library
// posts it only for an id whose ADDR_RESOLVED the program read and that no command since
// can have moved on (CONNECT, and a path set with SET_OPTION IB_PATH, would), and writes
// ROUTE_RESOLVED into the channel itself.
// An answered DISCONNECT with kCmEventWritten in `flags` (the library asks for it only for
// a connected RC/UC id whose end the program has not read) asks the router to leave the
// id's DISCONNECTED to the library: when the router has not reported the id's end itself,
// it sends the DREQ, ends the id without waiting for the DREP and without an event, and
// answers with kCmEventWritten in CmReply::flags; the library then writes DISCONNECTED into
// the channel. One of the two writes an id's end, never both. No other command, and no
// posted one, carries flags.
inline constexpr uint32_t kCmEventWritten = 1u;
inline constexpr uint32_t kCmMaxBody = 320;
inline constexpr uint32_t kCmMaxReply = 216;
inline constexpr uint32_t kCmRouteBytes = 208;  // sizeof(rdma_ucm_query_route_resp)
// What INIT_QP_ATTR is made of (freeflow/cm_qp_attr.h), as the router knows it.
struct CmQpInputs {
  uint32_t remote_ip;  // host byte order; 0 before a peer is known
  uint32_t remote_qpn;
  uint32_t remote_psn;
  uint32_t psn;
  uint32_t qkey;
  uint8_t qp_type;    // ibv_qp_type
  uint8_t connected;  // a REP was sent or received: the connection's attributes exist
  uint8_t responder_resources;
  uint8_t initiator_depth;
  uint8_t retry_count;
  uint8_t rnr_retry_count;
  uint8_t tos;
  uint8_t seen;  // the program has named the id (a listener's child is then its own)
};
// An id as the router left it after a command or an event: the library answers librdmacm's
// QUERY_ROUTE and INIT_QP_ATTR from the newest one (highest `version`) instead of asking
// the router again (three to five requests fewer per connection on each side).
struct CmIdState {
  uint32_t handle;                       // 0: none (the command named no id, or it is gone)
  uint32_t version;                      // the router's count of snapshots: a later one supersedes
  alignas(8) char route[kCmRouteBytes];  // the QUERY_ROUTE answer
  CmQpInputs qp;
};
struct CmCommand {
  RequestHeader<Op::kCmCommand> h;
  uint32_t channel;
  uint32_t cmd;      // RDMA_USER_CM_CMD_*
  uint32_t in_len;   // as in the command's header, at most kCmMaxBody
  uint32_t out_len;  // likewise: how many response bytes the program can take
  // CREATE_ID only: a handle the router granted this session (CmReply::grant_*), which the
  // new id takes: the library then posts the command and answers the program itself.
  // 0: the router picks the handle and answers it.
  uint32_t handle;
  uint32_t flags;  // kCmEventWritten (DISCONNECT only), else 0
  alignas(8) char body[kCmMaxBody];
};
// The answer to a CmCommand: `out_len` bytes to copy to the command's response (0 for the
// commands without one). DESTROY_ID's and MIGRATE_ID's events_reported are the library's
// to fill: only it knows which events the program has read. An answered CREATE_ID may
// grant the handles [grant_first, grant_first + grant_count) to the CREATE_IDs the session
// posts on the same channel (kCmHandleGrant of them, when the channel holds none unused).
struct CmReply {
  uint32_t out_len;
  uint32_t grant_first;
  uint32_t grant_count;
  uint32_t flags;  // kCmEventWritten: the library writes the DISCONNECTED (see above)
  alignas(8) char out[kCmMaxReply];
  CmIdState state;  // of the id the command named (or created)
};
// One event on a channel socket: `resp` is struct rdma_ucm_event_resp as the kernel writes
// it. `owner` is the id it is counted against (the listener for CONNECT_REQUEST, whose
// resp.id is the new id); kernel-style accounting (events_reported) is kept by the library.
inline constexpr uint32_t kCmEventRespBytes = 336;  // sizeof(rdma_ucm_event_resp)
struct CmEvent {
  uint32_t owner;
  uint32_t reserved;
  alignas(8) char resp[kCmEventRespBytes];
  CmIdState state;  // of resp.id (for CONNECT_REQUEST: the new id)
};

// ---- TCP mode (libfsocket.so; docs/tcp-mode.md) -------------------------------------------
// A TCP connection between two pods of one node whose both ends run libfsocket moves its
// bytes through a stream segment (stream_segment.h) the router makes, instead of the
// kernel's TCP; the kernel connection stays, carries only one-byte bells, and gives the
// socket its addresses, its readiness for poll/epoll and its FIN/RST. The router keeps a
// record per such connection, keyed by its four-tuple, from kSockConnect until the
// connection is gone from both ends' namespaces.
//
// Opens a socket session: answered with HelloReply (ip, prefix_len, node) and, when the
// router has one, one descriptor: the node's pod list (stream_pods.h), read-only.
struct SockHello {
  RequestHeader<Op::kSockHello> h;
  uint32_t abi;
  uint32_t reserved;
};
// The pod listens with libfsocket on TCP `port` of its overlay address (a socket bound to
// it or to INADDR_ANY): connects from pods of this node to it get a stream segment. Kept
// until kSockUnlisten from the same session (posted) or the session's end; a session may
// name a port more than once (each kSockListen needs its kSockUnlisten).
template <Op kOpValue>
struct SockPort {
  RequestHeader<kOpValue> h;
  uint32_t port;  // host byte order, 1..65535
  uint32_t reserved;
};
using SockListen = SockPort<Op::kSockListen>;
using SockUnlisten = SockPort<Op::kSockUnlisten>;
// One TCP connection as the asking end sees it: its own overlay address (implied: the
// session's), its port, and the other end's address and port.
//   kSockConnect: asked before the kernel connect, from a bound socket. When `peer_ip` is a
//     pod of this node listening with libfsocket on `peer_port`, the router makes the
//     record and its segment and answers 0 (role kStreamClient); else ENOENT (use kernel
//     TCP as is). A record left from an earlier connection with the same four-tuple is
//     replaced.
//   kSockClaim: the end of a connection the asking pod holds (an accepted connection, or a
//     descriptor it inherited across exec): 0 with its role, or ENOENT when no record
//     names this connection with the asking pod at that end.
//   kSockRelease (posted): the client's connect failed; the record goes if no server
//     claimed it.
//   kSockClosed (posted): the last descriptor of the asking pod's end, in the process that
//     sends it, is closed. The record goes once both ends said so (short connections must
//     not hold their pods' quotas until the next sweep); a later claim finds nothing.
// Answer (0): SockReply, fds [stream segment memfd, side memfd of the asker's end].
template <Op kOpValue>
struct SockTuple {
  RequestHeader<kOpValue> h;
  uint32_t peer_ip;     // network byte order
  uint16_t local_port;  // host byte order
  uint16_t peer_port;   // host byte order
};
using SockConnect = SockTuple<Op::kSockConnect>;
using SockClaim = SockTuple<Op::kSockClaim>;
using SockRelease = SockTuple<Op::kSockRelease>;
using SockClosed = SockTuple<Op::kSockClosed>;
inline constexpr uint32_t kStreamClient = 0, kStreamServer = 1;  // SockReply::role
struct SockReply {
  uint32_t role;        // kStreamClient: produce into ring 0, consume ring 1; else reversed
  uint32_t ring_bytes;  // each ring's size (a power of two); the segment is
                        // StreamSegmentBytes(ring_bytes), the side memfd kStreamSideBytes
};

struct HelloReply {
  uint32_t ctx_id;
  uint32_t ip;  // overlay IPv4, network byte order
  uint16_t lid;
  uint16_t reserved;
  uint32_t prefix_len;
  char node[128];  // node name, or on refusal the reason
};
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
inline constexpr uint16_t kConnectRemote = 1, kConnectOwnRing = 2;  // ConnectReply::flags
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
};
struct RegMrReply {
  uint32_t key;
  uint32_t reserved;
};
// fds: [region memfd]. writable == 0: map it read-only (it is sealed so; its registrations
// grant reads only).
struct GetRegionReply {
  uint64_t size;
  uint32_t writable;
  uint32_t reserved;
};

struct Response {
  Header h;
  int32_t status;  // 0 or a positive errno value
  uint32_t reserved;
  union {
    HelloReply hello;
    CreateQpReply create_qp;
    ConnectReply connect;
    RegMrReply reg_mr;
    GetRegionReply region;
    CmReply cm;
    SockReply sock;
    char raw[160];
  } u;
};

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
};
struct Event {
  EventType type;
  uint32_t qpn;
  uint32_t ring = 0;
  uint32_t src_ip = 0;
  uint32_t src_qpn = 0;
  uint32_t reserved = 0;
};

inline constexpr int kMaxFds = 8;
inline constexpr int kMaxMessage = 512;

// What the router accepts for each request: its exact size and how many descriptors come
// with it.
struct OpSpec {
  Op op;
  uint32_t size;
  uint8_t min_fds;
  uint8_t max_fds;
};
inline constexpr OpSpec kOpSpecs[] = {{Op::kHello, sizeof(Hello), 3, 3},
                                      {Op::kCreateChannel, sizeof(CreateChannel), 1, 1},
                                      {Op::kDestroyChannel, sizeof(DestroyChannel), 0, 0},
                                      {Op::kCreateCq, sizeof(CreateCq), 0, 0},
                                      {Op::kDestroyCq, sizeof(DestroyCq), 0, 0},
                                      {Op::kCreateSrq, sizeof(CreateSrq), 1, 1},
                                      {Op::kDestroySrq, sizeof(DestroySrq), 0, 0},
                                      {Op::kCreateQp, sizeof(CreateQp), 1, 1},
                                      {Op::kDestroyQp, sizeof(DestroyQp), 0, 0},
                                      {Op::kConnectQp, sizeof(ConnectQp), 0, 0},
                                      {Op::kDisconnectQp, sizeof(DisconnectQp), 0, 0},
                                      {Op::kResolveUd, sizeof(ConnectQp), 0, 0},
                                      {Op::kRegMr, sizeof(RegMr), 0, 1},
                                      {Op::kDeregMr, sizeof(DeregMr), 0, 0},
                                      {Op::kGetRegion, sizeof(GetRegion), 0, 0},
                                      {Op::kMoveMr, sizeof(MoveMr), 0, 1},
                                      {Op::kAllocMw, sizeof(AllocMw), 0, 0},
                                      {Op::kBindMw, sizeof(BindMw), 0, 0},
                                      {Op::kInvalidateMw, sizeof(InvalidateMw), 0, 0},
                                      {Op::kDeallocMw, sizeof(DeallocMw), 0, 0},
                                      {Op::kCmOpenChannel, sizeof(CmOpenChannel), 1, 1},
                                      {Op::kCmCommand, sizeof(CmCommand), 0, 0},
                                      {Op::kSockHello, sizeof(SockHello), 0, 0},
                                      {Op::kSockListen, sizeof(SockListen), 0, 0},
                                      {Op::kSockUnlisten, sizeof(SockUnlisten), 0, 0},
                                      {Op::kSockConnect, sizeof(SockConnect), 0, 0},
                                      {Op::kSockClaim, sizeof(SockClaim), 0, 0},
                                      {Op::kSockRelease, sizeof(SockRelease), 0, 0},
                                      {Op::kSockClosed, sizeof(SockClosed), 0, 0},
                                      {Op::kNameQp, sizeof(NameQp), 0, 0},
                                      {Op::kRequestRing, sizeof(RequestRing), 1, 1},
                                      {Op::kDoorbell, sizeof(Doorbell), 0, 0}};
static_assert(sizeof(kOpSpecs) / sizeof(kOpSpecs[0]) == static_cast<size_t>(Op::kMaxOp) - 1,
              "every op has a spec");
static_assert(sizeof(Response) <= static_cast<size_t>(kMaxMessage));

constexpr const OpSpec* SpecOf(Op op) {
  for (const OpSpec& s : kOpSpecs)
    if (s.op == op) return &s;
  return nullptr;
}
constexpr bool SpecsFitMessages() {
  for (const OpSpec& s : kOpSpecs)
    if (s.size > static_cast<uint32_t>(kMaxMessage) || s.max_fds > kMaxFds) return false;
  return true;
}
static_assert(SpecsFitMessages());

// Whether a request of `op` may be posted (kPostedSeq): rdma_cm commands, whose outcome
// the library can know in advance (DESTROY_ID of its own id, for one), DestroyQp (which
// cannot fail for the library's own QP, and whose answer it never used), NameQp (a real
// QP's RTR never fails for want of its peer; a refusal shows when the link is first made),
// CreateQp under a granted number (the router then checks the number: see CreateQp), and
// the socket session's hints that answer nothing. A posted request that answers descriptors
// would leave them nowhere.
constexpr bool IsPostable(Op op) {
  return op == Op::kCmCommand || op == Op::kCreateQp || op == Op::kDestroyQp || op == Op::kNameQp ||
         op == Op::kDoorbell || op == Op::kSockUnlisten || op == Op::kSockRelease ||
         op == Op::kSockClosed;
}
// The requests of a socket session (after kSockHello); a verbs session sends only the others.
constexpr bool IsSocketOp(Op op) {
  return op == Op::kSockListen || op == Op::kSockUnlisten || op == Op::kSockConnect ||
         op == Op::kSockClaim || op == Op::kSockRelease || op == Op::kSockClosed;
}

// Checks one datagram from a pod: a known op with the size and descriptor count its spec
// names, posted only if the op may be. On success *op is the request's op; false means a
// protocol violation.
inline bool DecodeRequest(const char* buf, size_t len, int nfds, Op* op) {
  if (len < sizeof(Header)) return false;
  Header h;
  std::memcpy(&h, buf, sizeof(h));
  const OpSpec* spec = SpecOf(h.op);
  if (spec == nullptr || len != spec->size || nfds < spec->min_fds || nfds > spec->max_fds)
    return false;
  if (h.seq == kPostedSeq && !IsPostable(h.op)) return false;
  *op = h.op;
  return true;
}

// The request of a datagram DecodeRequest accepted, as its type.
template <typename M>
M As(const char* buf) {
  M m;
  std::memcpy(&m, buf, sizeof(m));
  return m;
}

// How many descriptors come with a successful ConnectReply, or -1 when its fields do not
// describe a segment a library may map.
inline int ConnectReplyFds(const ConnectReply& c) {
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
