// TCP mode's claims table (libfsocket.so; docs/tcp-mode.md): per pod, the connections to
// it that the router has made a record for and that its server end has not claimed yet.
// The router alone writes it, in a memfd sealed against writable mappings (SealReadOnly),
// and hands it read-only to the pod's socket sessions at kSockHello, beside the pod list.
// A library that accepts a connection looks its four-tuple up before asking the router:
// a connection that is not in the table (the client's library chose kernel TCP for it, or
// the client has no library) is kernel TCP, with no round trip.
//
// The router writes the table at SockConnect, before it answers the client, and the client
// connects only after the answer: a record is in the table before its connection can be
// accepted. A record that does not fit (the table is full) is counted in `spilled`, and a
// reader that sees spilled records asks the router about every connection.
//
// Slots hold 64-bit keys (StreamClaimKey), open addressing with linear probing; 0 is an
// empty slot, kStreamClaimGone one whose key was taken out (a probe goes on past it). Every
// change happens under a sequence lock (odd while the router writes): a reader that saw the
// same even value before and after its probe trusts what it found. The reader treats the
// memory as untrusted all the same (its probe is bounded by the capacity it knows) and
// answers kUnknown — ask the router — when the table is being rewritten, has spilled
// records, or makes no sense.
//
// ABI: every constant and field here is part of the contract between the router and the
// pods' libraries; changing one needs a kAbiVersion bump (abi_constants.h, docs/protocol.md).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "freeflow/stream_pods.h"

namespace ff {

inline constexpr uint32_t kStreamClaimsMagic = 0x46465343;  // "FFSC"
inline constexpr uint32_t kStreamClaimsSlots = 4096;        // a power of two
// Keys the router keeps in the table at most (half the slots: short probes); more spill.
inline constexpr uint32_t kStreamClaimsCapacity = kStreamClaimsSlots / 2;
inline constexpr uint64_t kStreamClaimGone = 1;  // no record has port 0: no key is 1

struct StreamClaimsHeader {
  std::atomic<uint32_t> seq;
  uint32_t magic;
  std::atomic<uint32_t> count;    // keys in the slots
  std::atomic<uint32_t> spilled;  // unclaimed records not in the slots: readers ask
};
static_assert(sizeof(StreamClaimsHeader) == 16 && alignof(StreamClaimsHeader) == 4);
static_assert(offsetof(StreamClaimsHeader, seq) == 0 && offsetof(StreamClaimsHeader, magic) == 4 &&
              offsetof(StreamClaimsHeader, count) == 8 &&
              offsetof(StreamClaimsHeader, spilled) == 12);
inline constexpr uint32_t kStreamClaimsSlotsAt = 64;
inline constexpr uint64_t kStreamClaimsBytes = 36864;  // header + slots, whole pages
static_assert(kStreamClaimsSlotsAt + 8ull * kStreamClaimsSlots <= kStreamClaimsBytes);
static_assert(kStreamClaimsBytes % 4096 == 0);
static_assert((kStreamClaimsSlots & (kStreamClaimsSlots - 1)) == 0);
static_assert(std::atomic<uint64_t>::is_always_lock_free);

// A connection as the server's table names it: the client's address (host order) and port,
// and the server's port. Never 0 or kStreamClaimGone for a valid connection (ports 1..65535).
constexpr uint64_t StreamClaimKey(uint32_t client_ip, uint16_t client_port, uint16_t server_port) {
  return static_cast<uint64_t>(client_ip) << 32 | static_cast<uint64_t>(client_port) << 16 |
         server_port;
}

inline std::atomic<uint64_t>* StreamClaimSlots(void* base) {
  return reinterpret_cast<std::atomic<uint64_t>*>(static_cast<char*>(base) + kStreamClaimsSlotsAt);
}

constexpr uint32_t StreamClaimHome(uint64_t key) {
  return static_cast<uint32_t>((key * 0x9E3779B97F4A7C15ull) >> 40) & (kStreamClaimsSlots - 1);
}

// Does the table mapped at `base` (kStreamClaimsBytes, read-only) hold `key`? kYes: the
// router has an unclaimed record for that connection (ask it); kNo: it has none (kernel TCP,
// no need to ask); kUnknown: ask.
inline PodListed FindStreamClaim(const void* base, uint64_t key) {
  auto* mem = const_cast<void*>(base);  // read through atomics only
  auto* h = static_cast<StreamClaimsHeader*>(mem);
  std::atomic<uint64_t>* slots = StreamClaimSlots(mem);
  if (key == 0 || key == kStreamClaimGone) return PodListed::kUnknown;
  for (int attempt = 0; attempt < 4; ++attempt) {
    const uint32_t before = h->seq.load(std::memory_order_acquire);
    if (before & 1) continue;
    if (h->spilled.load(std::memory_order_relaxed) != 0) return PodListed::kUnknown;
    bool found = false, ended = false;
    for (uint32_t i = 0, at = StreamClaimHome(key); i < kStreamClaimsSlots; ++i) {
      const uint64_t v = slots[at].load(std::memory_order_relaxed);
      if (v == key) {
        found = true;
        break;
      }
      if (v == 0) {
        ended = true;
        break;
      }
      at = (at + 1) & (kStreamClaimsSlots - 1);
    }
    std::atomic_thread_fence(std::memory_order_acquire);
    if (h->seq.load(std::memory_order_relaxed) != before) continue;
    if (found) return PodListed::kYes;
    return ended ? PodListed::kNo : PodListed::kUnknown;  // no empty slot: not a table
  }
  return PodListed::kUnknown;
}

// The router's side, on the table at `base` (read-write). Each call is one change under the
// sequence lock.
class StreamClaimsWriter {
 public:
  // On a table that may hold records already (one a router took over from another): the
  // slots marked gone count.
  explicit StreamClaimsWriter(void* base) : base_(base) {
    std::atomic<uint64_t>* slots = StreamClaimSlots(base_);
    for (uint32_t i = 0; i < kStreamClaimsSlots; ++i)
      gone_ += slots[i].load(std::memory_order_relaxed) == kStreamClaimGone ? 1 : 0;
  }

  // Puts `key` in the slots (true) or, when they are at capacity, counts it spilled (false).
  bool Add(uint64_t key) {
    Begin();
    auto* h = header();
    const uint32_t n = h->count.load(std::memory_order_relaxed);
    bool placed = false;
    if (n < kStreamClaimsCapacity) {
      if (gone_ + n >= kStreamClaimsCapacity) Compact();
      std::atomic<uint64_t>* slots = StreamClaimSlots(base_);
      for (uint32_t at = StreamClaimHome(key);; at = (at + 1) & (kStreamClaimsSlots - 1)) {
        const uint64_t v = slots[at].load(std::memory_order_relaxed);
        if (v == 0 || v == kStreamClaimGone) {
          if (v == kStreamClaimGone) --gone_;
          slots[at].store(key, std::memory_order_relaxed);
          break;
        }
      }
      h->count.store(n + 1, std::memory_order_relaxed);
      placed = true;
    } else {
      h->spilled.store(h->spilled.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    }
    End();
    return placed;
  }

  // Takes out what Add did: the key from the slots (`placed`), or one spilled record.
  void Remove(uint64_t key, bool placed) {
    Begin();
    auto* h = header();
    if (placed) {
      std::atomic<uint64_t>* slots = StreamClaimSlots(base_);
      for (uint32_t i = 0, at = StreamClaimHome(key); i < kStreamClaimsSlots; ++i) {
        const uint64_t v = slots[at].load(std::memory_order_relaxed);
        if (v == 0) break;
        if (v == key) {
          slots[at].store(kStreamClaimGone, std::memory_order_relaxed);
          ++gone_;
          h->count.store(h->count.load(std::memory_order_relaxed) - 1, std::memory_order_relaxed);
          break;
        }
        at = (at + 1) & (kStreamClaimsSlots - 1);
      }
    } else if (const uint32_t s = h->spilled.load(std::memory_order_relaxed); s > 0) {
      h->spilled.store(s - 1, std::memory_order_relaxed);
    }
    End();
  }

 private:
  StreamClaimsHeader* header() { return static_cast<StreamClaimsHeader*>(base_); }
  void Begin() {
    auto* h = header();
    h->seq.store(h->seq.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
  }
  void End() {
    auto* h = header();
    h->seq.store(h->seq.load(std::memory_order_relaxed) + 1, std::memory_order_release);
  }
  // Puts every key back without the slots marked gone (inside Begin/End).
  void Compact() {
    std::atomic<uint64_t>* slots = StreamClaimSlots(base_);
    uint64_t keys[kStreamClaimsCapacity];
    uint32_t n = 0;
    for (uint32_t i = 0; i < kStreamClaimsSlots; ++i) {
      const uint64_t v = slots[i].load(std::memory_order_relaxed);
      if (v != 0 && v != kStreamClaimGone && n < kStreamClaimsCapacity) keys[n++] = v;
      slots[i].store(0, std::memory_order_relaxed);
    }
    for (uint32_t k = 0; k < n; ++k) {
      for (uint32_t at = StreamClaimHome(keys[k]);; at = (at + 1) & (kStreamClaimsSlots - 1)) {
        if (slots[at].load(std::memory_order_relaxed) == 0) {
          slots[at].store(keys[k], std::memory_order_relaxed);
          break;
        }
      }
    }
    gone_ = 0;
  }

  void* base_;
  uint32_t gone_ = 0;  // slots marked kStreamClaimGone
};

}  // namespace ff
