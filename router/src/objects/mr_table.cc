#include "objects/mr_table.h"

#include <cerrno>
#include <string>

#include "base/table_store.h"

namespace ff::router {

int MrTable::Create() {
  if (const int rc = RouterTables().Make("ffrouter-mrtable", kMrTableBytes, &fd_, &ro_fd_, &map_))
    return rc;
  next_slot_ = 1;
  tags_.clear();
  free_.clear();
  return 0;
}

MrEntry* MrTable::Entry(uint32_t key) {
  const uint32_t slot = MrSlotOfKey(key);
  if (slot == 0 || slot >= kMrTableSlots) return nullptr;
  MrEntry& e = map_.as<MrEntry>()[slot];
  return e.key.load(std::memory_order_relaxed) == key ? &e : nullptr;
}

int MrTable::Add(const MrView& v, uint32_t* key) {
  uint32_t slot = 0;
  if (!free_.empty()) {
    slot = free_.back();
    free_.pop_back();
  } else if (next_slot_ < kMrTableSlots && map_.get() != nullptr) {
    slot = next_slot_++;
    tags_.resize(next_slot_, 0);
  } else {
    return ENOMEM;
  }
  uint8_t tag = ++tags_[slot];
  if (tag == 0) tag = tags_[slot] = 1;
  const uint32_t k = (slot << 8) | tag;
  Write(map_.as<MrEntry>()[slot], k, v);
  *key = k;
  return 0;
}

void MrTable::Write(MrEntry& e, uint32_t key, const MrView& v) {
  UpdateMrEntry(e, [&] {
    e.access.store(v.access, std::memory_order_relaxed);
    e.region.store(v.region, std::memory_order_relaxed);
    e.addr.store(v.addr, std::memory_order_relaxed);
    e.length.store(v.length, std::memory_order_relaxed);
    e.region_offset.store(v.region_offset, std::memory_order_relaxed);
    e.qpn.store(v.qpn, std::memory_order_relaxed);
    e.pd.store(v.pd, std::memory_order_relaxed);
    e.key.store(key, std::memory_order_relaxed);
  });
}

int MrTable::Rewrite(uint32_t key, const MrView& v) {
  MrEntry* e = Entry(key);
  if (e == nullptr || v.key == 0 || MrSlotOfKey(v.key) != MrSlotOfKey(key)) return EINVAL;
  // The slot's next key after it is freed follows this one, so it differs from it.
  tags_[MrSlotOfKey(key)] = static_cast<uint8_t>(v.key & 0xff);
  Write(*e, v.key, v);
  return 0;
}

bool MrTable::Find(uint32_t key, MrView* out) const { return ReadMrEntry(entries(), key, out); }

bool MrTable::FindSlot(uint32_t slot, MrView* out) const {
  if (slot == 0 || slot >= kMrTableSlots || map_.get() == nullptr) return false;
  const uint32_t key = entries()[slot].key.load(std::memory_order_relaxed);
  return key != 0 && Find(key, out);
}

int MrTable::Remove(uint32_t key, uint32_t* region) {
  MrEntry* e = Entry(key);
  if (e == nullptr) return EINVAL;
  *region = e->region.load(std::memory_order_relaxed);
  UpdateMrEntry(*e, [&] { e->key.store(0, std::memory_order_relaxed); });
  free_.push_back(MrSlotOfKey(key));
  return 0;
}

int MrTable::Move(uint32_t key, uint32_t region, uint64_t region_offset) {
  MrEntry* e = Entry(key);
  if (e == nullptr) return EINVAL;
  UpdateMrEntry(*e, [&] {
    e->region.store(region, std::memory_order_relaxed);
    e->region_offset.store(region_offset, std::memory_order_relaxed);
  });
  return 0;
}

}  // namespace ff::router
