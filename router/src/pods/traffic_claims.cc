#include "pods/traffic_claims.h"

#include <algorithm>

namespace ff::router {

int TrafficClaims::Take(int fd, uint64_t now_ns) {
  if (taken()) return EINVAL;
  Mapping map;
  if (const int rc = MapPeerSegment(fd, kTrafficLedgerBytes, false, &map)) return rc;
  map_ = std::move(map);
  read_ns_ = now_ns;
  return 0;
}

namespace {

// What a read may still take, for the whole session.
struct Budget {
  uint64_t ops;
  uint64_t bytes;
};

// Takes `now` over `seen` into `*gained`: false (and nothing) when the count fell.
bool Gain(uint64_t now, uint64_t* seen, uint64_t* gained) {
  if (now < *seen) return false;
  *gained = now - *seen;
  *seen = now;
  return true;
}

}  // namespace

void TrafficClaims::Read(uint64_t now_ns, TrafficSink& sink, ClaimRefusals& refusals) {
  if (!taken()) return;
  const auto* header = map_.as<const TrafficLedgerHeader>();
  const TrafficSlot* slots = TrafficSlotsOf(map_.get());
  const uint32_t used = std::min(header->used.load(std::memory_order_acquire), kTrafficSlots);
  const uint64_t elapsed = now_ns > read_ns_ ? now_ns - read_ns_ : 0;
  read_ns_ = now_ns;
  Budget budget{elapsed * kMaxClaimedOpsPerNs, elapsed * kMaxClaimedBytesPerNs};
  const size_t known = seen_.size();
  if (seen_.size() < used) seen_.resize(used);
  for (uint32_t i = 0; i < used; ++i) {
    const TrafficSlot& slot = slots[i];
    Seen& seen = seen_[i];
    const uint32_t ip = slot.peer_ip.load(std::memory_order_relaxed);
    const uint32_t placement = slot.placement.load(std::memory_order_relaxed);
    if (i >= known) {
      seen.peer_ip = ip;
      seen.placement = placement;
    }
    if (ip != seen.peer_ip || placement != seen.placement || placement >= kTrafficPlacements) {
      refusals.Note(ClaimRefusal::kKey);
      continue;
    }
    for (uint32_t k = 0; k < kTrafficKinds; ++k) {
      uint64_t ops = 0, bytes = 0;
      const bool up = Gain(slot.counts[k].ops.load(std::memory_order_relaxed), &seen.ops[k], &ops);
      if (!up ||
          !Gain(slot.counts[k].bytes.load(std::memory_order_relaxed), &seen.bytes[k], &bytes)) {
        refusals.Note(ClaimRefusal::kDecrease);
        continue;
      }
      if (ops == 0 && bytes == 0) continue;
      if (ops > budget.ops || bytes > budget.bytes) {
        refusals.Note(ClaimRefusal::kRate);
        ops = std::min(ops, budget.ops);
        bytes = std::min(bytes, budget.bytes);
      }
      budget.ops -= ops;
      budget.bytes -= bytes;
      if (ops != 0 || bytes != 0)
        sink.Claimed(static_cast<TrafficPlacement>(placement), ip, static_cast<TrafficKind>(k), ops,
                     bytes);
    }
  }
}

}  // namespace ff::router
