// Where the router makes the tables it alone writes and pods read (MR tables, TCP mode's pod
// list and claims tables): files of a tmpfs of its own that no directory shows (a detached
// mount, fsopen/fsmount), each opened read-write for the router and read-only, for pods,
// through a read-only clone of that mount (open_tree + mount_setattr). A pod that reopens
// its descriptor through /proc/self/fd gets EROFS, root or not; it cannot map it writable,
// write, truncate or punch it either. Unlike a memfd sealed against writes (what the router
// made before, and makes when the mount API is refused), a table made here stays writable
// through its read-write descriptor in any process that holds one, so that a router taking
// over from this one (docs/handover.md) keeps writing the tables of the sessions it takes.
//
// Needs CAP_SYS_ADMIN (the router has it to enter pods' namespaces). Thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>

#include "freeflow/fd.h"

namespace ff::router {

class TableStore {
 public:
  // A table of `bytes` bytes, zero-filled: *rw the router's descriptor, *ro the pods', *map
  // the router's writable mapping. When the mount API is refused, a memfd sealed against
  // resizing and, once *map exists, against writes (*ro a read-only reopen of it). 0 or an
  // errno.
  int Make(const char* name, size_t bytes, UniqueFd* rw, UniqueFd* ro, Mapping* map);
  // A table another router made, handed over as its two descriptors: `ro` must be a router
  // table (read-only, of at least `bytes`) and `rw` the same file, which is then mapped
  // writable into *map. "" or why not (the hand-over refuses the state).
  static std::string Adopt(int rw, int ro, size_t bytes, Mapping* map);
  // Whether tables are made on the private tmpfs (tried once, on the first call of either);
  // and why not.
  bool movable();
  std::string why_not() const;

 private:
  bool OpenMounts();  // once; mu_ held

  mutable std::mutex mu_;
  bool tried_ = false;
  UniqueFd rw_mount_;  // the tmpfs, detached
  UniqueFd ro_mount_;  // its read-only clone
  std::string why_not_;
  uint64_t next_ = 0;  // names files while they are made (unlinked at once)
};

// The router process's store.
TableStore& RouterTables();

}  // namespace ff::router
