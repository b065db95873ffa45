// The direct wire: what two pod processes on different nodes send each other on the TCP
// connection their routers set up for them (docs/direct-path.md). Every frame is a
// DirectHead in clear, a body, and the kSealTagBytes tag of frame_seal.h over both; the
// receiver opens a frame before it looks at its body. A batch is small frames sealed as one:
// its body is their heads and bodies, one after another, without tags of their own. Bodies
// of records and responses are those of the node wire (RecordHeader + ProxyRequest/
// ProxyResponse + data, codec.h), so the decoders are the same. docs/protocol.md states the
// contract.
#pragma once

#include <cstddef>
#include <cstdint>

#include "freeflow/frame_seal.h"

namespace ff::direct {

inline constexpr uint32_t kMagic = 0x46464443;  // "FFDC"
inline constexpr uint32_t kVersion = 1;

enum class Type : uint16_t {
  kHello = 1,   // the dialler's first frame: Hello (opened by the acceptor's router, not the pod)
  kRecord = 2,  // a request record for channel `chan`
  kResp = 3,    // a response record for channel `chan`
  kCredit = 4,  // the target executed more of `chan`'s records: Credit
  kBatch = 5,   // frames sealed as one (BatchJoins); `chan` is 0
};

// Head::flags: the sending end takes batches. An end sends batches only once a frame of its
// peer said so: an end of an earlier release, which neither says it nor takes them, gets
// every frame alone. Every other bit of flags is 0.
inline constexpr uint16_t kTakesBatches = 1;

// The frames a batch may hold: Head and body each, no tag, within the batch's body. Any
// other type inside a batch, or a head that runs past its end, ends the connection.
constexpr bool BatchJoins(Type t) {
  return t == Type::kRecord || t == Type::kResp || t == Type::kCredit;
}

struct Head {
  uint32_t len;  // body bytes (the tag follows them)
  Type type;
  uint16_t flags;
  uint32_t chan;
  uint32_t reserved;
};
static_assert(sizeof(Head) == 16 && alignof(Head) == 4);

// The largest body a peer may send: one record of the largest fragment with its headers.
// A longer one ends the connection.
inline constexpr uint32_t kMaxBody = 64 * 1024;

// Proves that the sender holds the connection's secret, and names the connection.
struct Hello {
  uint32_t magic;
  uint32_t version;
  uint64_t conn;      // the connection's id, as the two routers agreed it
  uint32_t src_ip;    // the sending pod, host byte order
  uint32_t dest_ip;   // the pod it meant to reach
};
static_assert(sizeof(Hello) == 24 && alignof(Hello) == 8);

inline constexpr size_t kHelloFrameBytes = sizeof(Head) + sizeof(Hello) + kSealTagBytes;

struct Credit {
  uint64_t bytes;
};
static_assert(sizeof(Credit) == 8 && alignof(Credit) == 8);

}  // namespace ff::direct
