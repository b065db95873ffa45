// The shared memory of one TCP-mode connection between two pods of a node (libfsocket.so;
// docs/tcp-mode.md): two byte rings, one per direction, in a memfd the router makes and
// seals. Both pods map it read-write, so each treats everything in it as hostile input:
// indices are copied once, then checked against the ring size before any use.
//
// Ring 0 carries the client's bytes to the server, ring 1 the server's to the client. In each
// ring the producer alone writes `tail` (bytes produced, ever) and the data, the consumer
// alone writes `head` (bytes consumed, ever); 0 <= tail - head <= ring_bytes. The two waiting
// words are set by the side that is about to sleep and taken (exchanged to 0) by the other,
// which then rings the sleeper once:
//   rd_armed: the consumer sleeps until data comes -> the producer rings it (kBellData)
//   wr_armed: the producer sleeps until room comes  -> the consumer rings it (kBellSpace)
// How it is rung is the sleeper's word's value: kArmBell, one byte sent on the ringer's side
// of the connection's bell pair (a Unix stream socket pair the router made: each end holds
// one side, where it reads its own wake-ups); any other nonzero value, one bell byte on the
// kernel TCP connection. An end that cannot use its bell (it has none, or the send fails)
// rings the kernel connection instead; a sleeper waits on both.
// The side memfd of one end (kStreamSideBytes) is given to that end's pod only: its
// processes keep their locks there (several processes and threads may share a socket).
//
// ABI: every constant and field here is part of the contract between the two pods' libraries
// and the router; changing one needs a kAbiVersion bump (abi_constants.h, docs/protocol.md).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace ff {

inline constexpr uint32_t kStreamHeaderBytes = 4096;
inline constexpr uint32_t kStreamSideBytes = 4096;
inline constexpr char kBellData = 'D';
inline constexpr char kBellSpace = 'S';
// Values of rd_armed / wr_armed (0: nobody sleeps).
inline constexpr uint32_t kArmKernel = 1;  // ring me on the kernel TCP connection
inline constexpr uint32_t kArmBell = 2;    // ring me on my bell socket

struct StreamRingHeader {
  alignas(64) std::atomic<uint64_t> tail;
  alignas(64) std::atomic<uint64_t> head;
  alignas(64) std::atomic<uint32_t> rd_armed;
  std::atomic<uint32_t> wr_armed;
};
static_assert(sizeof(StreamRingHeader) == 192 && alignof(StreamRingHeader) == 64);
static_assert(offsetof(StreamRingHeader, tail) == 0 && offsetof(StreamRingHeader, head) == 64 &&
              offsetof(StreamRingHeader, rd_armed) == 128 &&
              offsetof(StreamRingHeader, wr_armed) == 132);
static_assert(std::atomic<uint64_t>::is_always_lock_free);

// The header page: ring i's header at i * kStreamRingHeaderStride; ring i's data at
// StreamRingData(ring_bytes, i).
inline constexpr uint32_t kStreamRingHeaderStride = 256;
static_assert(2 * kStreamRingHeaderStride <= kStreamHeaderBytes);
constexpr uint64_t StreamSegmentBytes(uint32_t ring_bytes) {
  return kStreamHeaderBytes + 2ull * ring_bytes;
}
constexpr uint64_t StreamRingData(uint32_t ring_bytes, uint32_t ring) {
  return kStreamHeaderBytes + static_cast<uint64_t>(ring) * ring_bytes;
}
// What a library accepts as ring_bytes from the router: a power of two in this range.
inline constexpr uint32_t kMinStreamRingBytes = 64 * 1024;
inline constexpr uint32_t kMaxStreamRingBytes = 64u << 20;
constexpr bool ValidStreamRingBytes(uint32_t b) {
  return b >= kMinStreamRingBytes && b <= kMaxStreamRingBytes && (b & (b - 1)) == 0;
}

}  // namespace ff
