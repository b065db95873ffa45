// Router-to-router frames, on one TCP connection per (initiating router, peer router).
// A connection carries the channels its initiator opened: requests flow from the
// initiator, responses and notifications flow back on the same connection. Every frame
// is validated; a malformed frame closes the connection (and fails what used it).
#pragma once

#include <cstdint>

namespace ff::router::wire {

inline constexpr uint32_t kMagic = 0x46465257;  // "FFRW"
inline constexpr uint32_t kVersion = 1;
inline constexpr uint32_t kMaxFrame = 1u << 20;

enum class Type : uint16_t {
  kHello = 1,         // initiator -> peer, first frame: Hello
  kConnect = 2,       // open channel `chan` to a QP of the peer: Connect
  kConnectReply = 3,  // ConnectReply
  kRecord = 4,        // a proxy-ring record (RecordHeader + OpHeader + data) for `chan`
  kResp = 5,          // a response record for `chan`
  kClose = 6,         // the initiator's QP behind `chan` is gone (flags 1: its process died)
  kPeerGone = 7,      // the target QP behind `chan` is gone (flags 1: its process died)
  kPing = 8,
  kPong = 9,
};

struct FrameHeader {
  uint32_t len;  // bytes after this header
  Type type;
  uint16_t flags;
  uint32_t chan;
  uint32_t reserved;
};
static_assert(sizeof(FrameHeader) == 16);

struct Hello {
  uint32_t magic;
  uint32_t version;
  char node[64];
};

struct Connect {
  uint32_t src_ip;  // host byte order
  uint32_t src_qpn;
  uint32_t qp_type;
  uint32_t dest_ip;  // host byte order
  uint32_t dest_qpn;
  uint32_t reserved;
};

struct ConnectReply {
  int32_t status;  // 0 or errno
  uint32_t peer_qpn;
  uint32_t peer_ip;
  uint32_t qp_type;
};

}  // namespace ff::router::wire
