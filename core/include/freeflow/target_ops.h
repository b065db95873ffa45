// What an initiator does to a target QP it can reach in shared memory: claim a receive
// credit, check an access against the target's MR table, perform an atomic, wake a
// target that sleeps on a completion channel. The preloaded library does this for peers
// on its own node; a router does it for initiators on other nodes. One implementation,
// so the two paths cannot drift apart.
#pragma once

#include <infiniband/verbs.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>

#include "freeflow/clock.h"
#include "freeflow/fd.h"
#include "freeflow/shm_layout.h"

namespace ff {

// Which registrations peers may reach, for the library that shares their pages and the
// router that checks what it is handed. Remote rights, or IBV_ACCESS_MW_BIND: memory windows
// bound over it later grant remote access of their own (the MR needs no remote flag, as on
// an HCA).
inline bool RegistrationReachable(unsigned access) {
  return (access & (IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC |
                    IBV_ACCESS_MW_BIND)) != 0;
}
// Whether peers may write it: remote write or atomics, or a window may grant them (the
// verbs allow that over a registration with IBV_ACCESS_MW_BIND and local write).
inline bool RegistrationWritable(unsigned access) {
  return (access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) != 0 ||
         ((access & IBV_ACCESS_MW_BIND) && (access & IBV_ACCESS_LOCAL_WRITE));
}

// Receiver-not-ready retries of one message, as an RC requester counts them: the first
// refusal starts the target's min_rnr_timer; each expiry with still no receive posted is
// one retry; rnr_retry 7 means retry forever.
struct RnrState {
  uint64_t deadline_ns = 0;  // 0: no refusal yet
  uint32_t tries = 0;
};

// IB encoding of min_rnr_timer (0..31) in microseconds.
inline uint64_t RnrTimerNs(uint32_t code) {
  static constexpr uint32_t kUs[32] = {
      655360, 10,    20,    30,    40,    60,     80,     120,    160,    240,   320,
      480,    640,   960,   1280,  1920,  2560,   3840,   5120,   7680,   10240, 15360,
      20480,  30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520};
  return static_cast<uint64_t>(kUs[code & 31]) * 1000;
}

// Called each time a claim fails. True when the retry budget is spent (report
// IBV_WC_RNR_RETRY_EXC_ERR); false: keep the message and try again.
inline bool RnrRetryExhausted(RnrState* s, uint32_t timer_code, uint32_t rnr_retry, uint64_t now) {
  const uint64_t interval = RnrTimerNs(timer_code);
  if (s->deadline_ns == 0) {
    s->deadline_ns = now + interval;
    return false;
  }
  if (now < s->deadline_ns) return false;
  ++s->tries;
  s->deadline_ns = now + interval;
  return rnr_retry != 7 && s->tries > rnr_retry;
}

// Claims one receive credit. `posted_cache` is the claimer's private copy of
// credits->posted, refreshed only when it runs out (keeps the shared line quiet).
inline bool ClaimCredit(RecvCredits* c, uint64_t* posted_cache) {
  uint64_t claimed = c->claimed.load(std::memory_order_relaxed);
  for (int attempt = 0; attempt < kCreditClaimAttempts; ++attempt) {
    if (claimed >= *posted_cache) {
      *posted_cache = c->posted.load(std::memory_order_acquire);
      if (claimed >= *posted_cache) return false;
    }
    if (c->claimed.compare_exchange_weak(claimed, claimed + 1, std::memory_order_acq_rel))
      return true;
  }
  return false;
}

// Checks an RDMA access of `len` bytes at `addr` with `rkey` against the target QP's
// access flags and protection domain and the target context's MR table. On success *out
// describes the MR (or the memory window: a window bound through one QP, type 2, serves
// only `target_qpn`). A key of another protection domain than the QP's is refused, as a
// responder HCA refuses it.
inline ibv_wc_status CheckRemoteAccess(const QpSegmentHeader* target_qp, uint32_t target_qpn,
                                       const MrEntry* table, uint32_t rkey, uint64_t addr,
                                       uint64_t len, uint32_t need, MrView* out) {
  if ((target_qp->qp_access.load(std::memory_order_relaxed) & need) != need)
    return IBV_WC_REM_ACCESS_ERR;
  if (!ReadMrEntry(table, rkey, out)) return IBV_WC_REM_ACCESS_ERR;
  if (out->qpn != 0 && out->qpn != target_qpn) return IBV_WC_REM_ACCESS_ERR;
  if (out->pd != target_qp->pd.load(std::memory_order_relaxed)) return IBV_WC_REM_ACCESS_ERR;
  if ((out->access & need) != need) return IBV_WC_REM_ACCESS_ERR;
  if (addr < out->addr || len > out->length || addr - out->addr > out->length - len)
    return IBV_WC_REM_ACCESS_ERR;
  return IBV_WC_SUCCESS;
}

// Offset inside the region memfd of `len` bytes at `addr` of a checked MR, or -1 when the
// entry points outside a region of `region_size` bytes (a corrupt or hostile table).
inline int64_t RegionOffset(const MrView& v, uint64_t addr, uint64_t len, uint64_t region_size) {
  const uint64_t off = v.region_offset + (addr - v.addr);
  if (off > region_size || len > region_size - off) return -1;
  return static_cast<int64_t>(off);
}

// Resolves an RDMA access to the target's memory: checks it (CheckRemoteAccess), finds the
// region that backs the MR through map_region(region_id, need) -> const Mapping* (nullptr
// when it cannot be mapped with the rights `need` asks for: a region shared read-only is
// never written) and checks the bounds against that mapping. On success *out points at
// the first byte. A zero-length access names no memory: only the target QP's access flags
// are checked, not the R_Key or the address (IBTA C9-88, as rxe does), and *out is nullptr.
// UCX flushes an RC endpoint with such a WRITE (rkey 0, address 0).
template <typename MapRegion>
ibv_wc_status ResolveTarget(const QpSegmentHeader* target_qp, uint32_t target_qpn,
                            const MrEntry* table, uint32_t rkey, uint64_t addr, uint64_t len,
                            uint32_t need, MapRegion&& map_region, char** out) {
  if (len == 0) {
    *out = nullptr;
    return (target_qp->qp_access.load(std::memory_order_relaxed) & need) == need
               ? IBV_WC_SUCCESS
               : IBV_WC_REM_ACCESS_ERR;
  }
  MrView v;
  const ibv_wc_status st =
      CheckRemoteAccess(target_qp, target_qpn, table, rkey, addr, len, need, &v);
  if (st != IBV_WC_SUCCESS) return st;
  const auto* m = map_region(v.region, need);
  if (m == nullptr) return IBV_WC_REM_ACCESS_ERR;
  const int64_t off = RegionOffset(v, addr, len, m->size());
  if (off < 0) return IBV_WC_REM_ACCESS_ERR;
  *out = m->template as<char>() + off;
  return IBV_WC_SUCCESS;
}

// What an atomic request needs of the target's registration: an ATOMIC_WRITE only stores,
// and needs remote write as rxe checks it; FETCH_AND_ADD and CMP_AND_SWP need remote atomic.
inline uint32_t AtomicAccess(uint32_t opcode) {
  return opcode == IBV_WR_ATOMIC_WRITE ? IBV_ACCESS_REMOTE_WRITE : IBV_ACCESS_REMOTE_ATOMIC;
}
// Whether the requester gets the word's original value back (an ATOMIC_WRITE returns none).
inline bool AtomicReturnsOriginal(uint32_t opcode) { return opcode != IBV_WR_ATOMIC_WRITE; }

// Performs FETCH_AND_ADD or CMP_AND_SWP on a 64-bit word of the target and returns the
// original value (host byte order, as rxe does); ATOMIC_WRITE stores the 8 bytes of
// `compare_add` whole (the requester's bytes as they were in its memory) and returns 0.
inline uint64_t AtomicOp(uint64_t* word, uint32_t opcode, uint64_t compare_add, uint64_t swap) {
  if (opcode == IBV_WR_ATOMIC_WRITE) {
    __atomic_store_n(word, compare_add, __ATOMIC_SEQ_CST);
    return 0;
  }
  if (opcode == IBV_WR_ATOMIC_FETCH_AND_ADD)
    return __atomic_fetch_add(word, compare_add, __ATOMIC_SEQ_CST);
  uint64_t old = compare_add;
  __atomic_compare_exchange_n(word, &old, swap, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return old;
}

// Disarms `slot` if it is armed for what happened: `any` for a CQ armed for any
// completion (or a doorbell), `solicited` for one armed for solicited completions only. True
// when the caller took the arm and must fire the event (FireSlot); false when it was not
// armed for this, or another party took it first.
inline bool TakeArm(NotifySlot* slot, bool any, bool solicited) {
  uint32_t armed = slot->armed.load(std::memory_order_relaxed);
  if (armed == 0 || !(armed == kArmedSolicited ? solicited : any)) return false;
  return slot->armed.compare_exchange_strong(armed, 0);
}

// Fires a disarmed slot: records when (events are taken oldest first) and wakes the owner's
// wake socket `fd` (fd.h). Never blocks, whatever the sleeper did to its socket.
inline void FireSlot(NotifySlot* slot, int fd) {
  slot->fired.store(MonotonicNs() | 1, std::memory_order_release);
  SendWake(fd);
}

// Records were published to a target: wake it if it armed `slot` (its CQ or doorbell) by
// sending on its wake socket `fd`. `solicited`: they complete a message its sender marked
// IBV_SEND_SOLICITED, which a CQ armed for solicited completions only waits for.
// The fence orders the publication before the read of `armed` (the sleeper arms, then
// looks again: one of the two sides always sees the other).
inline void WakeIfArmed(NotifySlot* slot, int fd, bool solicited) {
  if (slot == nullptr) return;
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (TakeArm(slot, true, solicited)) FireSlot(slot, fd);
}

}  // namespace ff
