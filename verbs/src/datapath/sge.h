// Scatter/gather lists of the application's buffers: copying into and out of them, and
// checking them against the context's registrations. Inline: used on every post and record.
#pragma once

#include <algorithm>
#include <cstring>

#include "base/objects.h"

namespace ff::verbs {

// Visits `len` bytes of the list starting `offset` bytes into it: visit(p, n) for each
// contiguous piece of n bytes at p, in order.
template <typename Visit>
inline void WalkSges(const ibv_sge* sges, uint32_t n, uint64_t offset, uint64_t len,
                     Visit&& visit) {
  for (uint32_t i = 0; i < n && len > 0; ++i) {
    if (offset >= sges[i].length) {
      offset -= sges[i].length;
      continue;
    }
    const uint64_t take = std::min<uint64_t>(sges[i].length - offset, len);
    visit(reinterpret_cast<char*>(sges[i].addr) + offset, take);
    len -= take;
    offset = 0;
  }
}

// Copies `len` bytes starting `offset` bytes into the list to `dst`.
inline void CopyFromSges(const ibv_sge* sges, uint32_t n, uint64_t offset, char* dst,
                         uint64_t len) {
  WalkSges(sges, n, offset, len, [&](const char* p, uint64_t take) {
    std::memcpy(dst, p, take);
    dst += take;
  });
}

// Copies `len` bytes from `src` into the list, starting `offset` bytes into it.
inline void CopyToSges(const ibv_sge* sges, uint32_t n, uint64_t offset, const char* src,
                       uint64_t len) {
  WalkSges(sges, n, offset, len, [&](char* p, uint64_t take) {
    std::memcpy(p, src, take);
    src += take;
  });
}

// True when every SGE lies inside a local registration of protection domain `pd` with its
// lkey and `need` access (an HCA refuses a registration of another PD as it refuses a wrong
// key). ctx->lock held (uses the context's one-entry cache).
inline bool ValidSges(Context* ctx, const ibv_pd* pd, const ibv_sge* sges, uint32_t n, int need) {
  for (uint32_t i = 0; i < n; ++i) {
    if (sges[i].length == 0) continue;
    const Mr* mr = ctx->last_mr;
    if (mr == nullptr || mr->mr.lkey != sges[i].lkey) {
      const uint32_t slot = ff::MrSlotOfKey(sges[i].lkey);
      if (slot >= ctx->mrs_by_slot.size()) return false;
      mr = ctx->mrs_by_slot[slot];
      if (mr == nullptr || mr->mr.lkey != sges[i].lkey) return false;
      ctx->last_mr = mr;
    }
    const uint64_t base = reinterpret_cast<uintptr_t>(mr->mr.addr);
    if (sges[i].addr < base || sges[i].length > mr->mr.length ||
        sges[i].addr - base > mr->mr.length - sges[i].length)
      return false;
    if ((mr->access & need) != need || mr->mr.pd != pd) return false;
  }
  return true;
}

}  // namespace ff::verbs
