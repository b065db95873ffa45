#include "base/traffic_ledger.h"

namespace ff::verbs {

TrafficTap& TrafficTap::operator=(TrafficTap&& o) noexcept {
  if (this == &o) return *this;
  Release();
  ledger_ = std::move(o.ledger_);
  slot_ = o.slot_;
  index_ = o.index_;
  shared_ = o.shared_;
  o.slot_ = nullptr;
  return *this;
}

void TrafficTap::Release() {
  if (slot_ != nullptr && !shared_) ledger_->Release(index_);
  slot_ = nullptr;
  ledger_.reset();
}

std::shared_ptr<TrafficLedger> TrafficLedger::Create(UniqueFd* fd) {
  auto ledger = std::make_shared<TrafficLedger>();
  UniqueFd made;
  if (ff::CreateSegment("ffverbs-traffic", ff::kTrafficLedgerBytes, &made) != 0) return nullptr;
  if (ff::MapSegment(made.get(), ff::kTrafficLedgerBytes, true, &ledger->map_) != 0) return nullptr;
  ledger->header_ = ledger->map_.as<ff::TrafficLedgerHeader>();
  ledger->slots_ = ff::TrafficSlotsOf(ledger->map_.get());
  // The shared slots, one per placement, come first.
  for (uint32_t p = 0; p < ff::kTrafficPlacements; ++p)
    ledger->slots_[p].placement.store(p, std::memory_order_relaxed);
  ledger->header_->used.store(ff::kTrafficPlacements, std::memory_order_release);
  ledger->busy_.assign(ff::kTrafficSlots, false);
  *fd = std::move(made);
  return ledger;
}

TrafficTap TrafficLedger::Take(uint32_t peer_ip, ff::TrafficPlacement placement) {
  const auto p = static_cast<uint32_t>(placement);
  std::lock_guard<std::mutex> lock(mu_);
  const uint32_t used = header_->used.load(std::memory_order_relaxed);
  for (uint32_t i = ff::kTrafficPlacements; i < used; ++i) {
    if (busy_[i] || slots_[i].peer_ip.load(std::memory_order_relaxed) != peer_ip ||
        slots_[i].placement.load(std::memory_order_relaxed) != p)
      continue;
    busy_[i] = true;
    return TrafficTap(shared_from_this(), &slots_[i], i, false);
  }
  if (used < ff::kTrafficSlots && peer_ip != 0) {
    slots_[used].peer_ip.store(peer_ip, std::memory_order_relaxed);
    slots_[used].placement.store(p, std::memory_order_relaxed);
    busy_[used] = true;
    header_->used.store(used + 1, std::memory_order_release);
    return TrafficTap(shared_from_this(), &slots_[used], used, false);
  }
  return TrafficTap(shared_from_this(), &slots_[p], p, true);
}

void TrafficLedger::Release(uint32_t index) {
  std::lock_guard<std::mutex> lock(mu_);
  busy_[index] = false;
}

}  // namespace ff::verbs
