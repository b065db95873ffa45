// TCP mode's pod list (libfsocket.so; docs/tcp-mode.md): the overlay addresses of this node's
// pods that TCP mode may accelerate a connection with — pods with a socket session, and the
// ends of records that still exist. The router alone writes it, in a memfd sealed against
// writable mappings (SealReadOnly), and hands it read-only to every socket session at
// kSockHello. A library looks a peer up before asking the router anything: a connect to an
// address not listed (another node, a pod without the library) and an accepted connection
// from one go straight to the kernel, without a round trip to the router.
//
// Entries sit sorted under a sequence lock: the router makes `seq` odd, rewrites, and makes
// it even again; a reader that saw the same even value before and after its search trusts
// what it found. The reader treats the memory as untrusted all the same (count is bounded by
// the capacity it knows) and answers kUnknown — ask the router — when the list is being
// rewritten, overflowed, or makes no sense.
//
// ABI: every constant and field here is part of the contract between the router and the
// pods' libraries; changing one needs a kAbiVersion bump (abi_constants.h, docs/protocol.md).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace ff {

inline constexpr uint32_t kStreamPodsMagic = 0x46465350;  // "FFSP"
inline constexpr uint32_t kStreamPodsCapacity = 4096;     // addresses; more sets `overflow`

struct StreamPodsHeader {
  std::atomic<uint32_t> seq;
  uint32_t magic;
  std::atomic<uint32_t> count;
  std::atomic<uint32_t> overflow;  // 1: not every address fits; a reader asks the router
};
static_assert(sizeof(StreamPodsHeader) == 16 && alignof(StreamPodsHeader) == 4);
static_assert(offsetof(StreamPodsHeader, seq) == 0 && offsetof(StreamPodsHeader, magic) == 4 &&
              offsetof(StreamPodsHeader, count) == 8 && offsetof(StreamPodsHeader, overflow) == 12);
inline constexpr uint32_t kStreamPodsEntriesAt = 64;
inline constexpr uint64_t kStreamPodsBytes = 20480;  // header + entries, whole pages
static_assert(kStreamPodsEntriesAt + 4ull * kStreamPodsCapacity <= kStreamPodsBytes);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

inline std::atomic<uint32_t>* StreamPodsEntries(void* base) {
  return reinterpret_cast<std::atomic<uint32_t>*>(static_cast<char*>(base) + kStreamPodsEntriesAt);
}

enum class PodListed { kNo, kYes, kUnknown };

// Is host-order address `ip` in the list mapped at `base` (kStreamPodsBytes, read-only)?
inline PodListed FindStreamPod(const void* base, uint32_t ip) {
  auto* mem = const_cast<void*>(base);  // read through atomics only
  auto* h = static_cast<StreamPodsHeader*>(mem);
  std::atomic<uint32_t>* e = StreamPodsEntries(mem);
  for (int attempt = 0; attempt < 4; ++attempt) {
    const uint32_t before = h->seq.load(std::memory_order_acquire);
    if (before & 1) continue;
    if (h->overflow.load(std::memory_order_relaxed) != 0) return PodListed::kUnknown;
    const uint32_t n = h->count.load(std::memory_order_relaxed);
    if (n > kStreamPodsCapacity) return PodListed::kUnknown;
    uint32_t lo = 0, hi = n;  // binary search in [lo, hi)
    bool found = false;
    while (lo < hi) {
      const uint32_t mid = lo + (hi - lo) / 2;
      const uint32_t v = e[mid].load(std::memory_order_relaxed);
      if (v == ip) {
        found = true;
        break;
      }
      if (v < ip) {
        lo = mid + 1;
      } else {
        hi = mid;
      }
    }
    std::atomic_thread_fence(std::memory_order_acquire);
    if (h->seq.load(std::memory_order_relaxed) == before)
      return found ? PodListed::kYes : PodListed::kNo;
  }
  return PodListed::kUnknown;
}

// The router's side: rewrites the list at `base` (read-write) with `ips`, sorted ascending.
inline void WriteStreamPods(void* base, const uint32_t* ips, uint32_t n) {
  auto* h = static_cast<StreamPodsHeader*>(base);
  std::atomic<uint32_t>* e = StreamPodsEntries(base);
  const uint32_t s = h->seq.load(std::memory_order_relaxed);
  h->seq.store(s + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  const bool fits = n <= kStreamPodsCapacity;
  h->overflow.store(fits ? 0 : 1, std::memory_order_relaxed);
  const uint32_t kept = fits ? n : 0;
  for (uint32_t i = 0; i < kept; ++i) e[i].store(ips[i], std::memory_order_relaxed);
  h->count.store(kept, std::memory_order_relaxed);
  h->seq.store(s + 2, std::memory_order_release);
}

}  // namespace ff
