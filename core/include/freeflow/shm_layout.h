// Layouts of the shared-memory segments that freeflow processes map.
//
// Ownership rules (who writes what) are stated on every field. Peers are not trusted:
// every value read from a segment another process can write is validated before use,
// so a hostile peer can at worst corrupt traffic addressed to itself.
//
// ABI: every constant, field, size and offset here is part of the contract between a pod's
// library, its peers and its router; changing one needs a kAbiVersion bump
// (abi_constants.h, docs/protocol.md). The static_asserts pin sizes and offsets to what
// processes of the current version map.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "freeflow/abi_constants.h"
#include "freeflow/tunables.h"

namespace ff {

inline constexpr size_t kCacheLine = 64;

// Completion-event word of one CQ with a completion channel. Lives in the owning
// context's notify segment, which connected peers map so they can wake the owner.
struct NotifySlot {
  // Owner sets 1 in req_notify_cq; whoever adds a completion (or a record that becomes
  // one) exchanges it to 0 and, if it was 1, stores in `fired` when that happened
  // (MonotonicNs, never 0) and writes the owner's wake socket. The owner takes events
  // oldest first, as a real completion channel delivers them, and clears `fired` to 0.
  // 0, kArmedAny, or kArmedSolicited (ibv_req_notify_cq's solicited_only).
  alignas(kCacheLine) std::atomic<uint32_t> armed{0};
  std::atomic<uint64_t> fired{0};
};
inline constexpr uint32_t kArmedAny = 1, kArmedSolicited = 2;
static_assert(sizeof(NotifySlot) == kCacheLine && alignof(NotifySlot) == kCacheLine);
static_assert(offsetof(NotifySlot, armed) == 0 && offsetof(NotifySlot, fired) == 8);
inline constexpr uint32_t kQpSegMagic = 0x46465150;  // "FFQP"

// Receive credits of one receive queue (a QP's own RQ or an SRQ). A sender may place a
// message that consumes a receive WQE only after it claimed a credit: that is how a
// SEND that finds no posted receive is detected (RNR) without the receiver running.
struct RecvCredits {
  // Written by the receive queue's owner only (plain release store): total WQEs posted.
  alignas(kCacheLine) std::atomic<uint64_t> posted{0};
  // Written by senders (compare-and-swap, so many senders can share an SRQ): total
  // WQEs claimed. claimed <= posted whenever every sender is honest.
  alignas(kCacheLine) std::atomic<uint64_t> claimed{0};
};
static_assert(sizeof(RecvCredits) == 2 * kCacheLine && alignof(RecvCredits) == kCacheLine);
static_assert(offsetof(RecvCredits, posted) == 0 && offsetof(RecvCredits, claimed) == kCacheLine);

// Single-producer single-consumer byte ring of records. The producer is the one peer QP
// the router assigned to this ring; the consumer is the owning (receiving) process.
struct RingHeader {
  // Producer-owned: bytes published. Release store after the record bytes are written.
  alignas(kCacheLine) std::atomic<uint64_t> tail{0};
  // Consumer-owned: bytes consumed. Release store after the record was copied out.
  alignas(kCacheLine) std::atomic<uint64_t> head{0};
};
static_assert(sizeof(RingHeader) == 2 * kCacheLine && alignof(RingHeader) == kCacheLine);
static_assert(offsetof(RingHeader, tail) == 0 && offsetof(RingHeader, head) == kCacheLine);

// One record in a ring. Records are 64-byte aligned and never wrap: a producer that
// reaches the end of the ring writes a kPad record over the remainder.
enum RecordKind : uint8_t {
  kRecPad = 1,
  kRecSend = 2,      // SEND / SEND_WITH_IMM payload fragment
  kRecWriteImm = 3,  // completion of an RDMA_WRITE_WITH_IMM (payload already placed)
  // Only in proxy segments and on node links (see codec.h): requests start their payload
  // with a ProxyRequest, responses with a ProxyResponse.
  kRecWrite = 4,      // RDMA_WRITE payload fragment
  kRecReadReq = 5,    // RDMA_READ request
  kRecAtomicReq = 6,  // ATOMIC_FETCH_AND_ADD / ATOMIC_CMP_AND_SWP / ATOMIC_WRITE request
  kRecResp = 7,       // router -> library: outcome of one work request (+ READ/atomic data)
  // Only in a session's request ring (proto::RequestRing): library -> router.
  kRecRequest = 8,   // its publish time (8 bytes), then one request's bytes
  kRecOnSocket = 9,  // its publish time alone: the next request with descriptors, on the socket
};
enum RecordFlags : uint8_t {
  kRecFirst = 1,
  kRecLast = 2,
  kRecImm = 4,
  kRecSolicited = 8,
  kRecInv = 16,  // SEND_WITH_INV: `imm` is the R_Key of the receiver's window to invalidate
};
struct RecordHeader {
  uint32_t total;  // bytes of this record including the header, multiple of 64
  uint8_t kind;    // RecordKind
  uint8_t flags;   // RecordFlags
  uint16_t reserved;
  uint32_t msg_len;   // whole message length (valid on the first fragment)
  uint32_t imm;       // immediate data, network byte order, when kRecImm (kRecInv: an R_Key)
  uint32_t src_qpn;   // sending QP
  uint32_t src_ip;    // sending pod's overlay address, network byte order (UD GRH)
  uint32_t frag_len;  // payload bytes that follow this header
  uint32_t qkey;      // UD only: the Q_Key the sender used
};
static_assert(sizeof(RecordHeader) == 32 && alignof(RecordHeader) == 4);
static_assert(offsetof(RecordHeader, total) == 0 && offsetof(RecordHeader, kind) == 4 &&
              offsetof(RecordHeader, flags) == 5 && offsetof(RecordHeader, msg_len) == 8 &&
              offsetof(RecordHeader, imm) == 12 && offsetof(RecordHeader, src_qpn) == 16 &&
              offsetof(RecordHeader, src_ip) == 20 && offsetof(RecordHeader, frag_len) == 24 &&
              offsetof(RecordHeader, qkey) == 28);

// A verbs session's request ring (proto::RequestRing): this block, a RingHeader, then
// kRequestRingBytes of records. The library produces and the router consumes; neither
// trusts what the other wrote (ring.h checks every index and record).
struct RequestRingControl {
  // The router stores 1 before it sleeps and 0 when it wakes; a library that publishes and
  // finds 1 exchanges it for 0 and sends a proto::Doorbell (one per sleep).
  alignas(kCacheLine) std::atomic<uint32_t> sleeping{0};
  // The CPU the router last ran on, plus one (0: not known). Written by the router when it
  // changes; the library does not spin for an answer on that CPU, where spinning only keeps
  // the router from answering.
  std::atomic<uint32_t> router_cpu{0};
};
static_assert(sizeof(RequestRingControl) == kCacheLine &&
              alignof(RequestRingControl) == kCacheLine);
static_assert(offsetof(RequestRingControl, sleeping) == 0 &&
              offsetof(RequestRingControl, router_cpu) == 4);
inline constexpr size_t RequestRingSegmentBytes(uint32_t ring_bytes) {
  return sizeof(RequestRingControl) + sizeof(RingHeader) + ring_bytes;
}
inline RingHeader* RequestRingOf(void* seg) {
  return reinterpret_cast<RingHeader*>(static_cast<char*>(seg) + sizeof(RequestRingControl));
}

inline constexpr uint32_t RecordBytes(uint32_t payload) {
  return (static_cast<uint32_t>(sizeof(RecordHeader)) + payload + kCacheLine - 1) &
         ~static_cast<uint32_t>(kCacheLine - 1);
}

// Head of a QP segment: one memfd per QP created by the QP's owner and shared (through
// the router) with the peers that send to it. Rings follow the header.
struct QpSegmentHeader {
  uint32_t magic;       // owner, at creation
  uint32_t abi;         // owner, at creation
  uint32_t num_rings;   // owner, at creation
  uint32_t ring_bytes;  // owner, at creation; power of two
  // Owner: the RNR timer a sender waits between retries (IB encoding 0..31).
  std::atomic<uint32_t> min_rnr_timer{0};
  // Owner: the QP's ibv_access_flags (remote write/read/atomic must be enabled on the
  // target QP as well as on the MR).
  std::atomic<uint32_t> qp_access{0};
  // Proxy segments only: work requests wait in the library for room in the request ring
  // (or for READ slots), which only the router makes. The library sets kSendsWaiting (from
  // 0) when one blocks and looks once more; the router, once it has drained the request
  // ring empty or delivered answers, turns kSendsWaiting into kSendsNudged and tells the
  // library (proto::EventType::kProxyDrained), whose event thread sets 0 and advances the
  // send queue. Without it, a program that posts and then waits on memory (a flag the peer
  // writes) would never see its last requests leave, as an HCA's would on its own.
  std::atomic<uint32_t> sends_waiting{0};
  // Owner, at creation: the QP's protection domain (the library's number for it, unique in
  // the process). A peer's R_Key serves the QP only when its registration or window is of
  // the same one (CheckRemoteAccess), as a responder HCA checks.
  std::atomic<uint32_t> pd{0};
  uint32_t reserved[8];
  RecvCredits credits;  // used when the QP has no SRQ
  // Proxy segments only: armed by the router before it sleeps on the doorbell eventfd;
  // the library rings the doorbell after publishing a request into an armed segment.
  NotifySlot doorbell;
};
static_assert(sizeof(QpSegmentHeader) % kCacheLine == 0);
static_assert(sizeof(QpSegmentHeader) == 4 * kCacheLine && alignof(QpSegmentHeader) == kCacheLine);
static_assert(offsetof(QpSegmentHeader, magic) == 0 && offsetof(QpSegmentHeader, abi) == 4 &&
              offsetof(QpSegmentHeader, num_rings) == 8 &&
              offsetof(QpSegmentHeader, ring_bytes) == 12 &&
              offsetof(QpSegmentHeader, min_rnr_timer) == 16 &&
              offsetof(QpSegmentHeader, qp_access) == 20 &&
              offsetof(QpSegmentHeader, sends_waiting) == 24 &&
              offsetof(QpSegmentHeader, pd) == 28 &&
              offsetof(QpSegmentHeader, credits) == kCacheLine &&
              offsetof(QpSegmentHeader, doorbell) == 3 * kCacheLine);
inline constexpr uint32_t kSendsWaiting = 1, kSendsNudged = 2;

inline constexpr size_t RingStride(uint32_t ring_bytes) { return sizeof(RingHeader) + ring_bytes; }
inline constexpr size_t QpSegmentBytes(uint32_t num_rings, uint32_t ring_bytes) {
  return sizeof(QpSegmentHeader) + static_cast<size_t>(num_rings) * RingStride(ring_bytes);
}
inline RingHeader* QpRing(void* seg, uint32_t index, uint32_t ring_bytes) {
  return reinterpret_cast<RingHeader*>(static_cast<char*>(seg) + sizeof(QpSegmentHeader) +
                                       index * RingStride(ring_bytes));
}
inline char* RingData(RingHeader* ring) { return reinterpret_cast<char*>(ring + 1); }
// A ring of its own (one UD sender's): its header, then its data.
inline constexpr size_t UdRingBytes(uint32_t ring_bytes) { return sizeof(RingHeader) + ring_bytes; }

// An SRQ's credits, claimed by its owner only (ABI 17): the receiving library claims each
// message for a QP on the SRQ when it takes it from the QP's ring. Senders (peer processes,
// the router's executor, the owner's own direct connections) claim on the QP's header
// credits, whose `posted` the owner keeps at the SRQ's unclaimed receives plus the messages
// of that QP it took (MirrorSrqCredits, at every ibv_post_srq_recv, from its own counts).
// A message that finds no receive left on the SRQ is dropped on UD and UC, as a fabric
// drops it, and waits in its ring on RC until one is posted. No peer maps the SRQ: what one
// writes in its QP's header changes only what that QP's senders see, and neither spends
// nor steals a receive another QP's message was promised.
struct SrqSegment {
  RecvCredits credits;
};
static_assert(sizeof(SrqSegment) == 2 * kCacheLine && alignof(SrqSegment) == kCacheLine);

inline constexpr size_t kNotifySegmentBytes = sizeof(NotifySlot) * kNotifySlots;

// One registered memory region as published by the router. Written only by the router
// under a sequence lock (odd while being changed); read by the owner and its peers.
struct MrEntry {
  std::atomic<uint32_t> seq{0};
  std::atomic<uint32_t> key{0};     // full lkey/rkey; 0 when the slot is free
  std::atomic<uint32_t> access{0};  // ibv_access_flags
  std::atomic<uint32_t> region{0};  // owner-chosen id of the memfd that backs it
  std::atomic<uint64_t> addr{0};    // application virtual address of the first byte
  std::atomic<uint64_t> length{0};
  std::atomic<uint64_t> region_offset{0};  // offset of `addr` inside the region memfd
  // A memory window of type 2 is reached only through the QP it was bound through (its
  // number); 0 for registrations and type 1 windows, which any QP of the owner serves.
  std::atomic<uint32_t> qpn{0};
  // The registration's or the window's protection domain, as its owner's library numbers
  // them (QpSegmentHeader::pd): only QPs of that domain serve its key.
  std::atomic<uint32_t> pd{0};
  uint64_t reserved[2];
};
static_assert(sizeof(MrEntry) == kCacheLine && alignof(MrEntry) == 8);
static_assert(offsetof(MrEntry, seq) == 0 && offsetof(MrEntry, key) == 4 &&
              offsetof(MrEntry, access) == 8 && offsetof(MrEntry, region) == 12 &&
              offsetof(MrEntry, addr) == 16 && offsetof(MrEntry, length) == 24 &&
              offsetof(MrEntry, region_offset) == 32 && offsetof(MrEntry, qpn) == 40 &&
              offsetof(MrEntry, pd) == 44);
inline constexpr size_t kMrTableBytes = sizeof(MrEntry) * kMrTableSlots;

inline constexpr uint32_t MrSlotOfKey(uint32_t key) { return key >> 8; }

// Changes an entry under its sequence lock (the router is its only writer): the sequence is
// odd while `change` runs, so that a reader (ReadMrEntry) never takes a half-written entry.
template <typename F>
void UpdateMrEntry(MrEntry& e, F&& change) {
  const uint32_t seq = e.seq.load(std::memory_order_relaxed);
  e.seq.store(seq + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  change();
  e.seq.store(seq + 2, std::memory_order_release);
}

// A consistent copy of an MrEntry, read under its sequence lock.
struct MrView {
  uint32_t key;
  uint32_t access;
  uint32_t region;
  uint64_t addr;
  uint64_t length;
  uint64_t region_offset;
  uint32_t qpn = 0;
  uint32_t pd = 0;
};

// Reads slot `key`'s entry; false when the key does not name a live registration.
inline bool ReadMrEntry(const MrEntry* table, uint32_t key, MrView* out) {
  const uint32_t slot = MrSlotOfKey(key);
  if (slot >= kMrTableSlots || key == 0) return false;
  const MrEntry& e = table[slot];
  for (int attempt = 0; attempt < kSeqlockReadAttempts; ++attempt) {
    const uint32_t s1 = e.seq.load(std::memory_order_acquire);
    if (s1 & 1) continue;
    out->key = e.key.load(std::memory_order_relaxed);
    out->access = e.access.load(std::memory_order_relaxed);
    out->region = e.region.load(std::memory_order_relaxed);
    out->addr = e.addr.load(std::memory_order_relaxed);
    out->length = e.length.load(std::memory_order_relaxed);
    out->region_offset = e.region_offset.load(std::memory_order_relaxed);
    out->qpn = e.qpn.load(std::memory_order_relaxed);
    out->pd = e.pd.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (e.seq.load(std::memory_order_relaxed) != s1) continue;
    return out->key == key;
  }
  return false;
}

}  // namespace ff
