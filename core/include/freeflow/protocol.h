// Messages between the container library and the router, over a SOCK_SEQPACKET Unix
// socket (one message per datagram, file descriptors as SCM_RIGHTS). Every message is a
// fixed-size POD: the router rejects any size, op or descriptor count it does not expect
// and disconnects the sender. Requests are answered in order with a Response carrying an
// errno-style status.
#pragma once

#include <cstdint>

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
  kMaxOp,
};

struct Header {
  Op op;
  uint32_t seq;  // echoed in the response
};

inline constexpr uint32_t kNoId = 0xffffffffu;

// fds: [notify segment memfd, event socket, wake eventfd]. The last notify slot
// (kWakeSlot) is the process's wake word: a router that delivers cross-node data to the
// process rings the wake eventfd when the word is armed.
inline constexpr uint32_t kWakeSlot = 4095;
struct Hello {
  Header h;
  uint32_t abi;
  uint32_t reserved;
};
// fds: [channel eventfd]
struct CreateChannel {
  Header h;
  uint32_t chan_id;
  uint32_t reserved;
};
struct DestroyChannel {
  Header h;
  uint32_t chan_id;
  uint32_t reserved;
};
struct CreateCq {
  Header h;
  uint32_t cq_id;
  uint32_t notify_slot;  // kNoId when the CQ has no completion channel
  uint32_t chan_id;      // kNoId likewise
  uint32_t reserved;
};
struct DestroyCq {
  Header h;
  uint32_t cq_id;
  uint32_t reserved;
};
// fds: [SRQ segment memfd]
struct CreateSrq {
  Header h;
  uint32_t srq_id;
  uint32_t reserved;
};
struct DestroySrq {
  Header h;
  uint32_t srq_id;
  uint32_t reserved;
};
// fds: [QP segment memfd]
struct CreateQp {
  Header h;
  uint32_t qp_type;  // ibv_qp_type
  uint32_t num_rings;
  uint32_t ring_bytes;
  uint32_t srq_id;     // kNoId when none
  uint32_t recv_cq_id;
  uint32_t send_cq_id;
};
struct DestroyQp {
  Header h;
  uint32_t qpn;
  uint32_t reserved;
};
// Connects local `qpn` (RC/UC, at RTR) or resolves a UD destination: the sender is given
// one ring of the destination QP to produce into. Address by overlay IPv4 (GID) when
// dest_ip != 0, else by LID.
struct ConnectQp {
  Header h;
  uint32_t qpn;
  uint32_t dest_ip;  // network byte order, 0 when addressing by LID
  uint32_t dest_qpn;
  uint16_t dest_lid;
  uint16_t reserved;
};
struct DisconnectQp {
  Header h;
  uint32_t qpn;
  uint32_t reserved;
};
// fds: [region memfd] when new_region != 0
struct RegMr {
  Header h;
  uint64_t addr;
  uint64_t length;
  uint64_t region_offset;
  uint64_t region_size;
  uint32_t access;
  uint32_t region_id;
  uint32_t new_region;
  uint32_t reserved;
};
struct DeregMr {
  Header h;
  uint32_t key;
  uint32_t release_region;  // the region named by the entry is no longer used
};
// Moves a live registration to another region (the library merged overlapping
// registrations into one memfd); the key stays the same. fds: [region memfd] when
// new_region != 0.
struct MoveMr {
  Header h;
  uint64_t region_offset;
  uint64_t region_size;
  uint32_t key;
  uint32_t region_id;
  uint32_t new_region;
  uint32_t release_old;  // the region the entry named before is no longer used
};
// Asks for the memfd of a region of the peer connected to `qpn`.
struct GetRegion {
  Header h;
  uint32_t qpn;
  uint32_t region_id;
};

struct HelloReply {
  uint32_t ctx_id;
  uint32_t ip;  // overlay IPv4, network byte order
  uint16_t lid;
  uint16_t reserved;
  uint32_t prefix_len;
  char node[128];  // node name, or on refusal the reason
};
struct CreateQpReply {
  uint32_t qpn;
  uint32_t reserved;
};
// fds: [peer QP segment, peer notify segment, peer MR table, peer channel eventfd (when
// notify_slot != kNoId), peer SRQ segment (when has_srq)]
// A peer on another node is reached through a proxy segment owned by the router:
// flags has kConnectRemote, fds are [proxy segment, doorbell eventfd], ring 0 carries
// requests (library -> router) and ring 1 responses (router -> library).
inline constexpr uint16_t kConnectRemote = 1;
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
// fds: [region memfd]
struct GetRegionReply {
  uint64_t size;
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
    char raw[160];
  } u;
};

// Router -> library notifications, on the event socket handed over at HELLO.
enum class EventType : uint32_t {
  kPeerGone = 1,    // the peer of `qpn` died (process, router or node): fail the QP
  kShutdown = 2,    // the router is stopping
  kPeerClosed = 3,  // the peer of `qpn` destroyed its QP: later sends fail, receives stay
};
struct Event {
  EventType type;
  uint32_t qpn;
};

inline constexpr int kMaxFds = 8;
inline constexpr int kMaxMessage = 256;

}  // namespace ff::proto
