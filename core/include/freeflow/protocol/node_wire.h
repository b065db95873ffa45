// The node wire: what one router sends another over a node link (TCP, with TLS unless
// --insecure-node-links): frames of a FrameHeader and a body. Transport frames (hello, ping,
// pong) are the link's own; the others carry proxied records (RecordHeader + ProxyRequest /
// ProxyResponse and data, codec.h), channel set-up and flow control, and the rdma_cm
// exchange. A router checks every frame (wire::ValidFrame, codec.h) before it looks at the
// body. A router closes an accepted link whose first frame, the dialling router's Hello,
// names another kMagic or kVersion. docs/protocol.md states the contract.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ff {

// Node wire: changing this needs a wire::kVersion bump. The largest frame body a peer may
// send; a longer one closes the link.
inline constexpr uint32_t kMaxFrame = 1u << 20;

namespace wire {

inline constexpr uint32_t kMagic = 0x46465257;  // "FFRW"
inline constexpr uint32_t kVersion = 5;  // 4: rdma_cm messages (kCm); 5: direct connections

enum class Type : uint16_t {
  // Transport frames: a node link handles these itself.
  kHello = 1,  // dialling router -> peer, first frame: Hello
  kPing = 8,
  kPong = 9,
  // Router messages, on the link the initiating router dialled: requests flow from the
  // dialler, answers and notifications flow back on the same link.
  kConnect = 2,       // open channel `chan` to a QP of the peer: Connect
  kConnectReply = 3,  // ConnectReply
  kRecord = 4,        // a request record (RecordHeader + ProxyRequest + data) for `chan`
  kResp = 5,          // a response record (RecordHeader + ProxyResponse + data) for `chan`
  kClose = 6,         // the initiator's QP behind `chan` is gone (flags 1: its process died)
  kPeerGone = 7,      // the target QP behind `chan` is gone (flags 1: its process died)
  kCredit = 10,       // the target executed more of `chan`'s records: Credit
  // rdma_cm between the routers that act as the two pods' kernels: one CmMessage, `flags`
  // its CmKind. Sent by each router on the link it dialled to the other; the receiver
  // checks that src_ip is a pod of the sending node.
  kCm = 11,
  // Router replacement (docs/handover.md), on any link either way; a router of an earlier
  // build closes the link over them, as over any type it does not know (its channels then
  // fail as on a lost router, which is what a replacement cost before). kHandingOver: the
  // sender is about to be replaced by a successor that resumes the channels of its links
  // (no body): a link of it that goes down within kResumeGraceNs parks them instead of
  // failing them. kResume: sent by a router first on a link it dialled to resume channels
  // it initiated and had parked: the body lists them (ResumeList). kResumed: the answer,
  // listing those of them the receiver holds no channel for (their target is gone).
  kHandingOver = 12,
  kResume = 13,
  kResumed = 14,
};

struct FrameHeader {
  uint32_t len;  // bytes after this header
  Type type;
  uint16_t flags;
  uint32_t chan;
  uint32_t reserved;
};
static_assert(sizeof(FrameHeader) == 16 && alignof(FrameHeader) == 4);

struct Hello {
  uint32_t magic;
  uint32_t version;
  char node[64];
};
static_assert(sizeof(Hello) == 72 && alignof(Hello) == 4);
static_assert(offsetof(Hello, magic) == 0 && offsetof(Hello, version) == 4 &&
                  static_cast<uint16_t>(Type::kHello) == 1,
              "a hello keeps its place in every version, so that a mismatch is told");

// A connect may ask for a direct connection between the two pods' processes instead of the
// relay through the routers (docs/direct-path.md): the bytes then go pod to pod, and the
// routers keep the channel only for its lifetime (kClose, kPeerGone). `token` names the
// initiator's process to the peer router (a number of the initiating router's, never a
// pod's word), so that every later QP pair of the same two processes shares the connection.
inline constexpr uint32_t kConnectAskDirect = 1;  // Connect::flags
struct Connect {
  uint32_t src_ip;  // host byte order
  uint32_t src_qpn;
  uint32_t qp_type;
  uint32_t dest_ip;  // host byte order
  uint32_t dest_qpn;
  uint32_t flags;   // kConnectAskDirect
  uint64_t token;   // with kConnectAskDirect: the initiator's process, else 0
};
static_assert(sizeof(Connect) == 32 && alignof(Connect) == 8);

// The answer. With kReplyDirect the channel is direct on connection `conn` of the two
// processes; with kReplyNewConn as well, that connection does not exist yet: the initiator's
// process dials `port` at the target's address (peer_ip) and proves `secret` with its first
// frame (direct_wire.h). `token` names the target's process to the initiating router (as
// Connect::token does the other way), `seal` is the cluster's SealMode. Without
// kReplyDirect the channel is relayed, as before.
inline constexpr uint32_t kReplyDirect = 1, kReplyNewConn = 2;  // ConnectReply::flags
struct ConnectReply {
  int32_t status;  // 0 or a positive errno value
  uint32_t peer_qpn;
  uint32_t peer_ip;
  uint32_t qp_type;
  uint32_t flags;  // kReplyDirect, kReplyNewConn
  uint16_t port;   // kReplyNewConn: the listener's port in the target pod
  uint8_t seal;    // SealMode (frame_seal.h)
  uint8_t reserved;
  uint64_t conn;   // kReplyDirect: the connection's id
  uint64_t token;  // kReplyDirect: the target's process
  uint8_t secret[32];  // kReplyNewConn: the connection's secret (kDirectSecretBytes)
};
static_assert(sizeof(ConnectReply) == 72 && alignof(ConnectReply) == 8);
// Flow control per channel: the initiator keeps at most kChannelWindow bytes of kRecord
// bodies that the target has not credited back, so a target that does not keep up holds
// back only its own channel, never the link that other channels share.
struct Credit {
  uint64_t bytes;  // kRecord body bytes executed (or discarded) since the last credit
};
static_assert(sizeof(Credit) == 8 && alignof(Credit) == 8);

// The body of kResume and kResumed: channel numbers (uint32_t, host byte order), at most
// kMaxResumeChans, the frame's length a whole number of them.
inline constexpr uint32_t kMaxResumeChans = kMaxFrame / sizeof(uint32_t);

// The connection-manager exchange (the IB CM's messages, carried whole): REQ, REP, RTU,
// REJ, DREQ, DREP, and SIDR REQ/REP for UD ids.
enum class CmKind : uint16_t {
  kReq = 1,
  kRep,
  kRtu,
  kRej,
  kDreq,
  kDrep,
  kSidrReq,
  kSidrRep,
  kMaxKind,
};
inline constexpr uint32_t kCmMaxPrivateData = 256;
struct CmMessage {
  uint32_t src_ip;    // host byte order: the sending pod
  uint32_t dst_ip;    // the receiving pod
  uint32_t src_comm;  // the sender's id
  uint32_t dst_comm;  // the receiver's id (0 in REQ and SIDR REQ)
  uint16_t src_port;
  uint16_t dst_port;
  uint16_t ps;      // rdma_cm port space
  uint8_t qp_type;  // ibv_qp_type
  uint8_t reason;   // REJ: the IB CM reason; SIDR REP: its status
  uint32_t qpn;
  uint32_t qkey;
  uint32_t psn;
  uint8_t responder_resources;
  uint8_t initiator_depth;
  uint8_t flow_control;
  uint8_t retry_count;
  uint8_t rnr_retry_count;
  uint8_t srq;
  uint16_t private_data_len;
  uint8_t private_data[kCmMaxPrivateData];
};
static_assert(sizeof(CmMessage) == 300 && alignof(CmMessage) == 4);
static_assert(offsetof(CmMessage, private_data_len) == 42 &&
              offsetof(CmMessage, private_data) == 44);

// True for a status a peer may send in a ConnectReply: 0 or an errno value (Linux's are
// below 4096).
constexpr bool ValidConnectStatus(int32_t status) { return status >= 0 && status < 4096; }

// True for frames that a node link handles itself (hello, ping, pong).
inline bool IsTransportFrame(Type t) {
  return t == Type::kHello || t == Type::kPing || t == Type::kPong;
}

}  // namespace wire
}  // namespace ff
