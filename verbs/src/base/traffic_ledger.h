// This process's traffic ledger (freeflow/traffic_ledger.h): the segment in which it counts
// the work requests its links carry out, for its router's metrics, and the tap through which
// one link counts.
//
// A link counts from the thread that executes its QP's work requests, under the context's
// lock, so a link alone in its slot needs no atomic read-modify-write: a plain load and store
// (the router reads whole words). A link takes a slot of its own, reusing a free one of the
// same peer and placement so that counts never move between keys; when the slots are gone it
// counts into its placement's shared slot (one of the first kTrafficPlacements, peer 0), with
// atomic adds. Slots are never given back to the router: a freed slot keeps its counts.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "freeflow/fd.h"
#include "freeflow/traffic_ledger.h"

namespace ff::verbs {

class TrafficLedger;

// What one link counts into; a default one counts nothing (no ledger).
class TrafficTap {
 public:
  TrafficTap() = default;
  TrafficTap(std::shared_ptr<TrafficLedger> ledger, ff::TrafficSlot* slot, uint32_t index,
             bool shared)
      : ledger_(std::move(ledger)), slot_(slot), index_(index), shared_(shared) {}
  TrafficTap(TrafficTap&& o) noexcept { *this = std::move(o); }
  TrafficTap& operator=(TrafficTap&& o) noexcept;
  TrafficTap(const TrafficTap&) = delete;
  TrafficTap& operator=(const TrafficTap&) = delete;
  ~TrafficTap() { Release(); }

  // One work request of `kind` with `bytes` of payload, carried out.
  void Count(ff::TrafficKind kind, uint64_t bytes) {
    if (slot_ == nullptr) return;
    ff::TrafficCount& c = slot_->counts[static_cast<uint32_t>(kind)];
    if (shared_) {
      c.ops.fetch_add(1, std::memory_order_relaxed);
      c.bytes.fetch_add(bytes, std::memory_order_relaxed);
    } else {
      c.ops.store(c.ops.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
      c.bytes.store(c.bytes.load(std::memory_order_relaxed) + bytes, std::memory_order_relaxed);
    }
  }
  bool counting() const { return slot_ != nullptr; }
  bool shared() const { return shared_; }

 private:
  void Release();
  std::shared_ptr<TrafficLedger> ledger_;
  ff::TrafficSlot* slot_ = nullptr;
  uint32_t index_ = 0;
  bool shared_ = false;
};

class TrafficLedger : public std::enable_shared_from_this<TrafficLedger> {
 public:
  // Makes the segment (sealed against shrinking) and maps it: *fd is what goes to the router.
  // nullptr when it cannot (the session then counts nothing).
  static std::shared_ptr<TrafficLedger> Create(UniqueFd* fd);

  // A tap for a link to `peer_ip` (host order) at `placement`.
  TrafficTap Take(uint32_t peer_ip, ff::TrafficPlacement placement);

 private:
  friend class TrafficTap;
  void Release(uint32_t index);
  std::mutex mu_;
  Mapping map_;
  ff::TrafficLedgerHeader* header_ = nullptr;
  ff::TrafficSlot* slots_ = nullptr;
  std::vector<bool> busy_;  // by slot: a link counts into it alone
};

}  // namespace ff::verbs
