// The traffic ledger: what a verbs session's library counts of the work requests it carries
// out, for its router's metrics (docs/metrics.md, "Traffic"). Pods of one node and the
// direct path across nodes move their data without the router, so the router cannot count
// it; the library counts each work request it carried out, by where its peer is (placement)
// and its kind, in a segment it hands over once (proto::TrafficLedger) and the router maps
// read-only and reads when it is scraped and when the session ends.
//
// What the ledger says is the pod's claim about its own traffic: the router labels it with
// what it knows itself (its own node, the node the control plane places the peer address
// on), takes only increases, and caps each increase at what the time since its last read
// allows (router/src/pods/traffic_claims.h). A pod that lies moves only the totals it is
// counted in, never another pod's series or the router's own figures.
//
// ABI: every constant, field, size and offset here needs a kAbiVersion bump to change.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "freeflow/shm_layout.h"

namespace ff {

// Where a work request's peer is: a process of this node (shared memory), a process of
// another node over the direct connection between the two processes, or one reached
// through the two routers (UD across nodes, --cross-node-path=relay).
enum class TrafficPlacement : uint32_t { kSameNode = 0, kDirect = 1, kRelay = 2 };
inline constexpr uint32_t kTrafficPlacements = 3;
// What it is: SEND (with immediate or invalidate), RDMA WRITE (with immediate), RDMA READ,
// or an atomic.
enum class TrafficKind : uint32_t { kSend = 0, kWrite = 1, kRead = 2, kAtomic = 3 };
inline constexpr uint32_t kTrafficKinds = 4;

struct TrafficCount {
  std::atomic<uint64_t> ops{0};    // work requests carried out
  std::atomic<uint64_t> bytes{0};  // their payload: message, WRITE or READ length; 8 an atomic
};

// One slot: the counts of work requests to one peer address at one placement. Written by
// the library only: the key once, before `used` covers the slot; the counts as it goes
// (never down). Slots whose key repeats are summed.
struct alignas(kCacheLine) TrafficSlot {
  std::atomic<uint32_t> peer_ip{
      0};  // host byte order; 0: several peers (the library ran out of slots)
  std::atomic<uint32_t> placement{0};  // TrafficPlacement
  uint64_t reserved = 0;
  TrafficCount counts[kTrafficKinds];  // by TrafficKind
};
static_assert(sizeof(TrafficSlot) == 2 * kCacheLine && alignof(TrafficSlot) == kCacheLine);
static_assert(offsetof(TrafficSlot, placement) == 4 && offsetof(TrafficSlot, counts) == 16);

inline constexpr uint32_t kTrafficSlots = 128;

// The segment: this header, then kTrafficSlots slots.
struct alignas(kCacheLine) TrafficLedgerHeader {
  // Slots in use, from the first; the library stores it (release) after it wrote a new
  // slot's key. The router reads no more than kTrafficSlots whatever it says.
  std::atomic<uint32_t> used{0};
};
static_assert(sizeof(TrafficLedgerHeader) == kCacheLine);

inline constexpr size_t kTrafficLedgerBytes =
    sizeof(TrafficLedgerHeader) + kTrafficSlots * sizeof(TrafficSlot);

inline TrafficSlot* TrafficSlotsOf(void* seg) {
  return reinterpret_cast<TrafficSlot*>(static_cast<char*>(seg) + sizeof(TrafficLedgerHeader));
}
inline const TrafficSlot* TrafficSlotsOf(const void* seg) {
  return reinterpret_cast<const TrafficSlot*>(static_cast<const char*>(seg) +
                                              sizeof(TrafficLedgerHeader));
}

// Label values, as the router's metrics print them.
inline const char* TrafficPlacementName(TrafficPlacement p) {
  switch (p) {
    case TrafficPlacement::kSameNode:
      return "same_node";
    case TrafficPlacement::kDirect:
      return "direct";
    case TrafficPlacement::kRelay:
      return "relay";
  }
  return "?";
}
inline const char* TrafficKindName(TrafficKind k) {
  switch (k) {
    case TrafficKind::kSend:
      return "send";
    case TrafficKind::kWrite:
      return "write";
    case TrafficKind::kRead:
      return "read";
    case TrafficKind::kAtomic:
      return "atomic";
  }
  return "?";
}

}  // namespace ff
