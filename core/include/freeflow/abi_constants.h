// The version of the contract between a pod's libraries (libffverbs.so, libfsocket.so) and
// its node's router, and the constants its layouts are made of. A library and a router whose
// kAbiVersion differ refuse each other at HELLO, so each side may take every value below to
// be the other's too. What forces a bump, and what a bump does to running pods, is written
// in docs/protocol.md ("The ABI version").
//
// Local knobs, which one program may change without telling the other, are in tunables.h.
// The layouts these constants size are in shm_layout.h (shared memory) and protocol/
// (messages); the node wire between routers has its own version (protocol/node_wire.h).
#pragma once

#include <cstdint>

namespace ff {

// Version of the router <-> library protocol, of the shared-memory layouts and of the proxy
// records: a library and a router with different values refuse each other at HELLO.
inline constexpr uint32_t kAbiVersion = 22;

// ---- shared memory: sizes both sides map ------------------------------------------------
// ABI: changing this needs a version bump. MR entries per context (key: slot<<8|tag); the
// MR table every peer maps is kMrTableBytes (shm_layout.h).
inline constexpr uint32_t kMrTableSlots = 16384;
// ABI: changing this needs a version bump. CQ event words of a notify segment; the last is
// the wake word (proto::kWakeSlot). Peers map the whole segment (kNotifySegmentBytes).
inline constexpr uint32_t kNotifySlots = 4096;
// ABI: changing this needs a version bump. A verbs session's request ring (proto::RequestRing),
// which the router takes only at this size: room for about 140 rdma_cm commands (the
// largest request, 448 bytes a record) that the router has not served yet.
inline constexpr uint32_t kRequestRingBytes = 64 * 1024;

// ---- what a QP segment may look like (the router checks it at CreateQp, the library in
// ConnectReplyFds) -----------------------------------------------------------------------
// ABI: changing this needs a version bump. Rings of one QP segment, at most.
inline constexpr uint32_t kMaxRingsPerQp = 64;
// ABI: changing this needs a version bump. Smallest ring.
inline constexpr uint32_t kMinRingBytes = 4096;
// ABI: changing this needs a version bump. Largest ring.
inline constexpr uint32_t kMaxRingBytes = 64u << 20;

// ---- records (rings, and frames between routers) ------------------------------------------
// ABI: changing this needs a version bump, and one of wire::kVersion. Largest record payload
// (pipelines copies): a receiver refuses a longer one (codec.h, kMaxRequestPayload).
inline constexpr uint32_t kMaxFragment = 32 * 1024;
// ABI: changing this needs a version bump, and one of wire::kVersion. Largest message
// (the device's max_msg_sz): RecordHeader::msg_len and ProxyRequest::length are 32-bit, and
// codec.h's DecodeRequest refuses a longer request.
inline constexpr uint64_t kMaxMsgSize = 1ull << 31;

}  // namespace ff
