// Compile-time tunables of the freeflow data path, kept in one place.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ff {

// Version of the router <-> library protocol and of the shared-memory layouts.
// A library and router with different values refuse each other at HELLO.
inline constexpr uint32_t kAbiVersion = 1;

inline constexpr size_t kCacheLine = 64;

// Bytes of one inbound ring of an RC/UC QP. Large enough for a few 64 KiB messages in
// flight, small enough to stay cache-warm on a 2-core machine.
inline constexpr uint32_t kRcRingBytes = 512 * 1024;
// UD QPs get one ring per sending QP (the router hands them out); each is smaller
// because a UD message is at most one MTU.
inline constexpr uint32_t kUdRingBytes = 64 * 1024;
inline constexpr uint32_t kUdRingsPerQp = 16;

// Largest payload of one ring record: a longer message is cut into fragments so that
// the receiver copies out while the sender is still copying in.
inline constexpr uint32_t kMaxFragment = 32 * 1024;

// Slots in a context's MR table (shared read-only with connected peers). The slot is
// encoded in the key: key = slot << 8 | tag.
inline constexpr uint32_t kMrTableSlots = 16384;

// Slots for CQ notification words (only CQs with a completion channel use one).
inline constexpr uint32_t kNotifySlots = 4096;  // the last one is the process wake word

inline constexpr uint32_t kMtu = 4096;
inline constexpr uint32_t kMaxInline = 512;
inline constexpr uint32_t kMaxSge = 32;
inline constexpr uint32_t kMaxQpWr = 16384;
inline constexpr uint32_t kMaxCqe = 4 * 1024 * 1024;
inline constexpr uint32_t kMaxRdAtomic = 16;
inline constexpr uint64_t kMaxMsgSize = 1ull << 31;

static_assert((kRcRingBytes & (kRcRingBytes - 1)) == 0, "ring size must be a power of two");
static_assert((kUdRingBytes & (kUdRingBytes - 1)) == 0, "ring size must be a power of two");
static_assert(kMaxFragment <= kRcRingBytes / 4);
static_assert(kMtu + 64 <= kUdRingBytes / 4);

}  // namespace ff
