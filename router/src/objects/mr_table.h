// The MR table of one pod connection: a table the router alone writes (entries under a
// sequence lock, shm_layout.h) and shares read-only with the owner and the peers connected
// to it (made by base/table_store.h: a file of the router's private tmpfs, or a sealed memfd). Keys
// are slot << 8 | tag: a freed slot comes back with a new tag, so a stale key never names a later
// registration by accident.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <vector>

#include "freeflow/fd.h"
#include "freeflow/shm_layout.h"

namespace ff::router {

class HandoverState;

class MrTable {
 public:
  // Hand-over (docs/handover.md, objects/handover.cc): the table as a record naming both its
  // descriptors; and back, mapping the read-write one (HandoverError when it cannot be, as a
  // sealed memfd cannot).
  nlohmann::json Export(HandoverState& state) const;
  void Import(HandoverState& state, const nlohmann::json& j);
  // Creates the table and its read-only twin. Returns 0 or an errno value.
  int Create();
  // The descriptor the owner and its peers map (read-only).
  int read_only_fd() const { return ro_fd_.get(); }
  const MrEntry* entries() const { return map_.as<const MrEntry>(); }
  // Live registrations.
  size_t size() const { return next_slot_ - 1 - free_.size(); }

  // Publishes a registration; *key receives its key. ENOMEM when the table is full.
  int Add(const MrView& entry, uint32_t* key);
  // The live entry of `key`: false when `key` names none.
  bool Find(uint32_t key, MrView* out) const;
  // The live entry in `slot`, whatever its key: false when the slot is free.
  bool FindSlot(uint32_t slot, MrView* out) const;
  // Invalidates `key` before returning, so no peer lookup succeeds afterwards; *region
  // receives the region the entry named. EINVAL for an unknown key.
  int Remove(uint32_t key, uint32_t* region);
  // Points a live entry at another region (the owner merged overlapping registrations).
  int Move(uint32_t key, uint32_t region, uint64_t region_offset);
  // Rewrites the live entry of `key` as `v`, under v.key, which must name the same slot (a
  // memory window rebound with a new key). EINVAL otherwise.
  int Rewrite(uint32_t key, const MrView& v);

 private:
  MrEntry* Entry(uint32_t key);  // nullptr unless `key` is live
  static void Write(MrEntry& e, uint32_t key, const MrView& v);

  UniqueFd fd_;     // read-write, the router's only
  UniqueFd ro_fd_;  // what the owner and its peers get
  Mapping map_;
  // Slots are handed out in order and recycled from `free_`; only slots used so far have a
  // tag, so a connection that registers little costs little (every HELLO makes a table).
  uint32_t next_slot_ = 1;  // slot 0: never a key
  std::vector<uint8_t> tags_;
  std::vector<uint32_t> free_;  // released slots
};

}  // namespace ff::router
