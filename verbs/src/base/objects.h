// The library's objects: what stands behind every ibv_* handle it hands out.
//
// Threading: every data-path structure of a context (QPs, CQs, SRQs, their queues and links)
// is guarded by that context's spinlock `Context::lock`; verbs take it for their whole body
// and never block while holding it. The event thread never takes it: it only raises atomics
// (`Connection::peer_gone`, `Context::attention`) that the data path acts on
// (HandleAttention).
//
// Buffer ownership: a send WQE refers to the application's buffers until its completion is
// generated (inline data is copied at post time). Receive buffers are written only by the
// owning process, when it drains its rings in poll_cq.
//
// Errors: internal functions return 0 or a positive errno value (core's convention, fd.h)
// and never set errno; the extern "C" entry points convert to what each verb defines.
#pragma once

#include <infiniband/verbs.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "base/log.h"
#include "base/traffic_ledger.h"
#include "freeflow/clock.h"
#include "freeflow/codec.h"
#include "freeflow/fd.h"
#include "freeflow/protocol.h"
#include "freeflow/qp_kind.h"
#include "freeflow/ring.h"
#include "freeflow/shm_layout.h"
#include "freeflow/target_ops.h"
#include "freeflow/tunables.h"

namespace ff::verbs {

using ff::Mapping;
using ff::UniqueFd;

// A context's (and a CQ's poll) lock: uncontended it costs one atomic exchange, like a
// spin lock; contended it spins briefly, then sleeps on a futex. It may be held across a
// router round trip (the event thread links a QP when its peer names it; a WRITE maps a
// peer's region), and a pure spin lock then took the CPU that the holder, or the router it
// waits for, needed: on two vCPUs, rdma_cm connections stalled for a scheduler tick (1-5 ms)
// in one of every few (bench/cm_rate). The futex protocol: 0 free, 1 held, 2 held with
// sleepers possible.
//
// The event thread takes it with lock_urgent() and goes before the program's threads. A
// program that polls in a loop takes the lock again the moment it lets go, and a sleeper the
// futex woke finds it taken, and every router event behind the one the event thread holds
// waits with it (a new direct channel, a UD ring): with three threads retaking it on two
// vCPUs its worst wait was 70-150 ms, 0.2 ms now (unit.verbs.AdaptiveLockTest). While it
// waits, lock() yields to it for at most kLockYieldNs and try_lock() fails.
class AdaptiveLock {
 public:
  void lock() {
    if (urgent_.load(std::memory_order_relaxed) != 0) YieldToUrgent();
    LockNow();
  }
  void lock_urgent() {
    urgent_.fetch_add(1, std::memory_order_relaxed);
    LockNow();
    urgent_.fetch_sub(1, std::memory_order_relaxed);
  }
  bool try_lock() {
    if (urgent_.load(std::memory_order_relaxed) != 0) return false;
    int free = 0;
    return state_.compare_exchange_strong(free, 1, std::memory_order_acquire,
                                          std::memory_order_relaxed);
  }
  void unlock() {
    if (state_.exchange(0, std::memory_order_release) == 2) Wake();
  }

 private:
  static_assert(sizeof(std::atomic<int>) == sizeof(int));
  void LockNow() {
    for (int i = 0; i < ff::kLockSpins; ++i) {
      int free = 0;
      if (state_.compare_exchange_weak(free, 1, std::memory_order_acquire,
                                       std::memory_order_relaxed))
        return;
      __builtin_ia32_pause();
    }
    while (state_.exchange(2, std::memory_order_acquire) != 0) Wait();
  }
  void YieldToUrgent() {
    const uint64_t until = ff::MonotonicNs() + ff::kLockYieldNs;
    while (urgent_.load(std::memory_order_relaxed) != 0 && ff::MonotonicNs() < until) {
      const int saved = errno;
      ::sched_yield();
      errno = saved;
    }
  }
  int* word() { return reinterpret_cast<int*>(&state_); }
  // Sleeps while the state is still 2 (a spurious or early return only loops again); the
  // program's errno is left as it was.
  void Wait() { Futex(FUTEX_WAIT_PRIVATE, 2); }
  void Wake() { Futex(FUTEX_WAKE_PRIVATE, 1); }
  void Futex(int op, int val) {
    const int saved = errno;
    ::syscall(SYS_futex, word(), op, val, nullptr, nullptr, 0);
    errno = saved;
  }
  std::atomic<int> state_{0};
  std::atomic<int> urgent_{0};  // event threads waiting in lock_urgent()
};

// lock_guard for the event thread: lock_urgent() instead of lock().
class UrgentGuard {
 public:
  explicit UrgentGuard(AdaptiveLock& l) : l_(l) { l_.lock_urgent(); }
  ~UrgentGuard() { l_.unlock(); }
  UrgentGuard(const UrgentGuard&) = delete;
  UrgentGuard& operator=(const UrgentGuard&) = delete;

 private:
  AdaptiveLock& l_;
};

struct Context;
struct Qp;
struct Cq;
struct Session;
struct LinkOps;
struct DirectOut;

// A peer process on this node as its QPs' links see it: its notify words and MR table
// (shared by every link to it) and the regions of its memory mapped so far.
struct PeerRegionMap {
  Mapping map;
  bool writable = false;  // false: the owner shared it for reads only (and sealed it so)
};
struct PeerCtx {
  uint32_t ctx_id = 0;
  Mapping notify;
  Mapping mr_table;
  std::unordered_map<uint32_t, PeerRegionMap> regions;
  uint32_t last_region = ~0u;  // one-entry cache in front of `regions`
  PeerRegionMap* last_mapping = nullptr;
};

// The sending side of a connection: a ring we produce into, and how to use it. Made by
// ConnectLink (connect.cc), which also picks `ops`; nothing else tests what kind it is.
struct PeerLink {
  const LinkOps* ops = nullptr;
  uint32_t peer_ctx_id = 0;
  uint32_t peer_qpn = 0;
  uint32_t peer_ip = 0;  // host byte order
  uint16_t peer_lid = 0;
  uint32_t qp_type = 0;
  // Both kinds: the segment holding our ring and who to wake after publishing into it (the
  // peer's CQ event word, or the router's doorbell).
  Mapping seg;
  ff::QpSegmentHeader* hdr = nullptr;
  Mapping own_ring;  // a UD destination on this node: the ring of our own it gave us
  ff::RingProducer producer;
  ff::NotifySlot* notify = nullptr;
  UniqueFd notify_fd;
  bool dead = false;
  bool dirty = false;      // records committed but not yet published
  bool solicited = false;  // ... among them, the end of a message marked IBV_SEND_SOLICITED
  // Same node only: the receive credits we claim (the peer QP's header), and the peer process.
  ff::RecvCredits* credits = nullptr;
  uint64_t posted_cache = 0;
  std::shared_ptr<PeerCtx> pctx;
  // Through the router only: the router's answers (kProxyResponseRing).
  ff::RingConsumer responses;
  // Through a direct connection only: its channel (direct/direct.h).
  std::shared_ptr<DirectOut> direct;
  // Where the work requests it carries out are counted (the session's traffic ledger).
  TrafficTap traffic;
};

struct Pd {
  ibv_pd pd;
  // Unique in the process, never 0: what the MR table and QP segments name the domain by
  // (ff::MrEntry::pd, QpSegmentHeader::pd), so that a peer's key serves only QPs of the
  // domain it was registered in. pd.handle is per context and would repeat across them.
  uint32_t id = 0;
  // Address handles created on it (they are the application's alone: no list holds them).
  std::atomic<uint32_t> ahs{0};
};
inline uint32_t PdId(const ibv_pd* pd) {
  return pd == nullptr ? 0 : reinterpret_cast<const Pd*>(pd)->id;
}

// A memfd that backs registered memory (memory.cc). Process-wide by address.
// Pages of registrations with remote access, moved into a memfd that the router may hand
// to connected peers. Registrations without remote access have none.
struct Region {
  uint32_t id = 0;
  uintptr_t start = 0;
  size_t size = 0;
  UniqueFd fd;
  Session* session = nullptr;  // the one router that has this memfd
  bool read_only = false;      // sealed: no registration in it grants remote write/atomics
};

struct Mr {
  ibv_mr mr;
  uint64_t iova = 0;
  int access = 0;
  Region* region = nullptr;
  uint32_t windows = 0;  // memory windows bound to it (ctx->lock): it cannot be deregistered
};

// A memory window (mw.cc): an entry of the context's MR table that the router points at part
// of a registration when the window is bound.
struct Mw {
  ibv_mw mw;
  uint32_t key = 0;     // its key as the router has it (mw.rkey may be ahead: type 1 binds)
  Mr* bound = nullptr;  // the registration it is bound to, nullptr when unbound (ctx->lock)
};

struct Channel {
  ibv_comp_channel ch;  // ch.fd: the receiving end of the channel's wake socket (fd.h)
  UniqueFd tx;          // its sending end, which the router and same-node peers hold too
  uint32_t id = 0;
  Context* ctx = nullptr;
  std::vector<Cq*> cqs;
};

struct Cq {
  union {
    ibv_cq cq;      // ibv_cq_ex begins with ibv_cq's fields: one CQ, seen either way
    ibv_cq_ex cqx;  // filled in by ibv_create_cq_ex only (cq_ex.cc)
  };
  uint32_t id = 0;
  Context* ctx = nullptr;
  std::vector<ibv_wc> wcs;  // ring of completions, power-of-two size
  uint32_t mask = 0;
  uint64_t head = 0, tail = 0;
  uint32_t capacity = 0;  // what the user asked for (cqe)
  Channel* channel = nullptr;
  uint32_t notify_slot = ff::proto::kNoId;
  std::vector<Qp*> recv_qps;  // QPs whose receives complete here
  bool overflowed = false;
  uint32_t events_acked = 0;
  // Extended CQs: the completion start_poll/next_poll made current, and the lock held from
  // start_poll to end_poll unless the CQ was created single-threaded.
  ibv_wc current{};
  AdaptiveLock poll_lock;
  bool single_threaded = false;
  bool ignore_overrun = false;  // IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN: no CQ_ERR when it overflows
  // ibv_poll_cq's empty polls in a row that did not sleep on the router (counted up to
  // kEmptyPollsPerCheck), when such a streak was first seen long, and how often a streak
  // gave the CPU away (completion.cc; ctx->lock).
  uint32_t empty_polls = 0;
  uint64_t empty_since_ns = 0;
  uint64_t yields = 0;
  // The streak is long and every source of the CQ wakes a sleeper (direct connections, the
  // router): each empty poll sleeps until one finds a completion, instead of spinning
  // kEmptyPollsPerCheck polls (a system call each, on direct connections) between sleeps.
  bool idle_sleeps = false;
};

struct RecvWqe {
  uint64_t wr_id;
  uint32_t num_sge;
  uint64_t total;
};

// Receive WQEs of a QP without SRQ or of an SRQ.
struct RecvQueue {
  std::vector<RecvWqe> wqes;
  std::vector<ibv_sge> sges;
  uint32_t max_wr = 0, max_sge = 0, mask = 0;
  uint64_t head = 0, tail = 0;
  ff::RecvCredits* credits = nullptr;
  uint64_t posted = 0;  // private mirror of credits->posted
  uint32_t count() const { return static_cast<uint32_t>(tail - head); }
};

struct Srq {
  ibv_srq srq;
  uint32_t id = 0;
  Context* ctx = nullptr;
  UniqueFd seg_fd;
  Mapping seg;
  RecvQueue rq;
  uint32_t limit = 0;
  // Its QPs: their header credits show its unclaimed receives to their senders
  // (MirrorSrqCredits, shm_layout.h SrqSegment). Under the context's lock.
  std::vector<Qp*> qps;
};

struct Ah {
  ibv_ah ah;
  uint32_t ip = 0;  // host byte order, 0 when addressed by LID
  uint16_t lid = 0;
};

struct SendWqe {
  uint64_t wr_id;
  uint32_t opcode;  // ibv_wr_opcode
  uint32_t flags;   // ibv_send_flags
  bool signaled;
  uint32_t num_sge;
  uint64_t length;
  uint64_t remote_addr;
  uint32_t rkey;
  uint32_t imm;
  uint64_t compare_add, swap;
  // BIND_MW only (with remote_addr, compare_add as the length, rkey as the new key and imm
  // as the rights); not reset for other opcodes.
  ibv_mw* mw;
  ibv_mr* bind_mr;
  // UD
  uint32_t dest_ip;
  uint16_t dest_lid;
  uint32_t remote_qpn, remote_qkey;
  // Progress of its execution.
  uint64_t sent;  // payload bytes written so far
  bool credit;    // a receive credit of the peer was claimed
  bool started;   // the first record (or the data of a WRITE) is out
  ff::RnrState rnr;
  uint32_t pre_status;  // ibv_wc_status found at post time (bad lkey, ...)
  bool in_flight;       // executed; the outcome comes back later (LinkOps::collect)
  bool done;            // outcome known (status), waiting to be retired in order
  bool answered;        // the outcome came in a response (whose writer fired the CQ event)
  uint32_t status;
  uint64_t posted_ns;  // with FFV_REPORT_WAITS only (send_waits.h); 0 otherwise
};

// What happens to an inbound message while its fragments arrive.
struct InboundState {
  bool active = false;
  bool drop = false;
  RecvWqe wqe{};
  ibv_sge sges[ff::kMaxSge];  // copied: the RQ slot may be reused while fragments arrive
  uint64_t offset = 0;
  uint32_t msg_len = 0;
  ibv_wc_status status = IBV_WC_SUCCESS;
};

// kRefused: the router refused the QP's posted create (proto::EventType::kQpRefused).
enum class PeerGone : uint32_t { kNo = 0, kDestroyed = 1, kDied = 2, kRefused = 3 };

// A QP's receiving side: its own segment, whose rings peers (or the router) produce into, one
// consumer per ring, the message arriving on each, and its receive queue.
struct Inbound {
  UniqueFd seg_fd;
  Mapping seg;
  uint32_t num_rings = 0, ring_bytes = 0;
  std::vector<ff::RingConsumer> consumers;
  std::vector<InboundState> messages;  // per ring
  // UD: each sender's ring is a memfd of its own that the router made and named the sender
  // of (kUdRing); `sources` says who that is, whatever the records claim. The event thread
  // queues new rings in `arriving`; the data path installs them (peer_events.cc), or the
  // event thread when a ring changes hands again before they were.
  struct UdSource {
    uint32_t ip = 0;  // host order
    uint32_t qpn = 0;
    Mapping ring;
  };
  struct ArrivingRing {
    uint32_t ring;
    uint32_t ip;
    uint32_t qpn;
    UniqueFd fd;
  };
  std::vector<UdSource> sources;
  std::mutex arriving_mu;
  std::vector<ArrivingRing> arriving;
  InboundState imm_scratch;   // receive WQE of a WRITE_WITH_IMM being completed
  RecvQueue rq;               // unused with an SRQ
  bool srq_waits = false;     // an RC message waits in a ring for a receive of the SRQ
  uint64_t srq_messages = 0;  // messages taken from its rings (received or dropped), on an SRQ
};

// Who a QP sends to: its link to its peer (RC/UC) or to each destination (UD), chosen by
// connect.cc, and what the event thread tells of the peer.
struct Connection {
  std::unique_ptr<PeerLink> link;  // RC/UC
  // RC/UC at RTR whose peer has not named this QP yet (the router answered EINPROGRESS):
  // the link is asked for again, with backoff, when a WQE first needs it (connect.cc).
  struct AwaitedPeer {
    bool waiting = false;
    uint32_t ip = 0;  // host order; 0: by LID
    uint16_t lid = 0;
    uint32_t qpn = 0;
    uint64_t deadline_ns = 0;  // set by the first WQE that waits; UINT64_MAX: none
    uint64_t next_ns = 0;
    uint64_t backoff_ns = 0;
  } awaited;
  std::unordered_map<uint64_t, std::unique_ptr<PeerLink>> ud_links;  // UD: ip<<32|qpn
  // UD: destinations the router refused to link (same keys), and when to ask again.
  struct Unreachable {
    uint64_t next_ns = 0;
    uint64_t backoff_ns = 0;
  };
  std::unordered_map<uint64_t, Unreachable> ud_unreachable;

  std::atomic<uint32_t> peer_gone{0};   // PeerGone, raised by the event thread
  std::atomic<bool> peer_named{false};  // kPeerNamed came: an awaited link may be asked for

  // The router refused the QP's create: it has nothing there to bring up again.
  bool refused() const { return peer_gone.load() == static_cast<uint32_t>(PeerGone::kRefused); }
  // Forgets the peer (modify_qp to RESET). A QP the router refused stays failed: it has no
  // QP there to reset.
  void Forget() {
    link.reset();
    awaited = AwaitedPeer{};
    ud_links.clear();
    ud_unreachable.clear();
    if (!refused()) peer_gone.store(0);
  }
};

// A QP's send queue (send_queue.h): a ring of WQEs, each with room for its SGEs and inline
// data. [head, exec): executed, not yet completed; [exec, tail): not yet executed.
struct SendQueue {
  std::vector<SendWqe> wqes;
  std::vector<ibv_sge> sges;      // max_sge per WQE
  std::vector<char> inline_data;  // ff::kMaxInline per WQE
  uint32_t mask = 0;
  uint32_t max_sge = 0;
  uint64_t head = 0, exec = 0, tail = 0;
  uint32_t inflight = 0;        // executed WQEs whose outcome has not come back
  uint32_t reads_inflight = 0;  // of those, READs and atomics (at most max_rd_atomic)
  bool in_pending_list = false;
  // The last Progress() left a WQE waiting for something that no router advances (room or a
  // credit of a peer on this node, the peer's consent): the event thread advances it while
  // the program calls nothing (StallTicker, peer_events.h), at the latest at stall_due_ns
  // (an RNR retry budget or the next consent retry; UINT64_MAX: none).
  bool stalled = false;
  uint64_t stall_due_ns = UINT64_MAX;
  // A WQE failed because its peer is gone (closed, or unknown to the router): the error is
  // held back until this time, as a real requester reports it only once its retries ran out
  // (RetryExhaustedAt). 0: none held. Nothing after that WQE is executed meanwhile.
  uint64_t peer_error_due_ns = 0;
  // When the last WQE retired, with FFV_REPORT_WAITS (send_waits.h).
  uint64_t last_retired_ns = 0;

  // Room for `capacity` (a power of two) WQEs of up to `wqe_sges` SGEs each.
  void Size(uint32_t capacity, uint32_t wqe_sges) {
    mask = capacity - 1;
    max_sge = wqe_sges;
    wqes.assign(capacity, SendWqe{});
    sges.assign(static_cast<size_t>(capacity) * wqe_sges, ibv_sge{});
    inline_data.assign(static_cast<size_t>(capacity) * ff::kMaxInline, 0);
  }
  SendWqe& at(uint64_t index) { return wqes[index & mask]; }
  const SendWqe& at(uint64_t index) const { return wqes[index & mask]; }
  ibv_sge* sges_of(uint64_t index) { return &sges[(index & mask) * max_sge]; }
  char* inline_of(uint64_t index) { return &inline_data[(index & mask) * ff::kMaxInline]; }
  bool empty() const { return head == tail; }
  // Forgets every WQE: none is queued, executing or in flight, and no error is held.
  void Forget() {
    head = tail;
    exec = tail;
    inflight = 0;
    reads_inflight = 0;
    peer_error_due_ns = 0;
  }
};

// ibv_wr_* state between wr_start and wr_complete (wr_api.cc).
struct WrBatch {
  std::vector<ibv_send_wr> wrs;
  std::vector<ibv_sge> sges;
  std::vector<char> inline_data;
  std::vector<size_t> sge_begin;     // per batched WR: first index in sges
  std::vector<size_t> inline_begin;  // per batched WR: first byte in inline_data, or npos
  int error = 0;

  void Clear() {
    wrs.clear();
    sges.clear();
    inline_data.clear();
    sge_begin.clear();
    inline_begin.clear();
    error = 0;
  }
};

struct Qp {
  ibv_qp_ex qpx;  // must stay first: ibv_qp* <-> Qp*
  Context* ctx = nullptr;
  const ff::QpKind* kind = &ff::kRcQp;  // chosen once, at create
  Cq* scq = nullptr;
  Cq* rcq = nullptr;
  Srq* srq = nullptr;
  ibv_qp_attr attr{};
  ibv_qp_cap cap{};
  bool sq_sig_all = false;
  uint64_t send_ops_flags = 0;
  // IBV_EVENT_QP_LAST_WQE_REACHED was raised since the QP last left RESET (an SRQ's QP, once
  // in the error state: nothing more of the SRQ will complete on it).
  bool last_wqe_reached = false;

  Inbound inbound;
  Connection conn;
  SendQueue sq;
  WrBatch batch;
};

struct AsyncEvent {
  ibv_event_type type;
  void* element;  // ibv_qp*, ibv_cq*, ibv_srq* or nullptr
};

struct Context {
  verbs_context vctx;  // must stay first; ibv_context is its last member
  Session* session = nullptr;
  AdaptiveLock lock;
  // The event thread raised Connection::peer_gone (or peer_named) of some QP, or queued a
  // UD ring for one.
  std::atomic<bool> attention{false};
  // Some QP of the context is SendQueue::stalled: set by the data path (which then wakes the
  // event thread through Session::tick_tx), cleared by the event thread under `lock` once
  // none is.
  std::atomic<bool> stalled{false};
  // ProgressPending() passes (written under `lock`): the event thread leaves a context whose
  // program keeps polling to advance its own sends. `tick_passes`: the event thread's copy.
  std::atomic<uint64_t> passes{0};
  uint64_t tick_passes = 0;
  std::vector<Qp*> qps;
  std::vector<Qp*> pending;  // QPs with send WQEs not yet completed
  std::vector<Cq*> cqs;
  std::vector<Srq*> srqs;
  std::vector<Channel*> channels;
  std::unordered_map<uint32_t, std::weak_ptr<PeerCtx>> peers;
  // The peers linked to last, kept mapped while no link holds them (ff::kRecentPeers): a program
  // that connects to one peer again and again (an rdma_cm client) maps its notify words and
  // MR table once, not per connection.
  std::deque<std::shared_ptr<PeerCtx>> recent_peers;
  std::vector<Mr*> mrs_by_slot;           // local lkey lookup
  std::unordered_map<uint32_t, Mw*> mws;  // memory windows by MR-table slot
  const Mr* last_mr = nullptr;  // the registration the last SGE check found (one-entry cache)
  // The receive queue a message last took a WQE of, whose next buffer the next empty poll
  // brings into the cache (WarmNextRecv); cleared when its QP or SRQ goes. Under `lock`.
  const RecvQueue* warm_rq = nullptr;
  // Async events (any thread may push; the application reads them).
  std::mutex async_mu;
  std::deque<AsyncEvent> async_events;
  UniqueFd async_fd;
};

// Capacity of a ring of at least `v` entries.
inline uint32_t RoundPow2(uint32_t v) {
  uint32_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

inline Context* ToCtx(ibv_context* c) { return reinterpret_cast<Context*>(verbs_get_ctx(c)); }
inline Qp* ToQp(ibv_qp* q) { return reinterpret_cast<Qp*>(q); }
inline Cq* ToCq(ibv_cq* c) { return reinterpret_cast<Cq*>(c); }
inline Srq* ToSrq(ibv_srq* s) { return reinterpret_cast<Srq*>(s); }
inline Mr* ToMr(ibv_mr* m) { return reinterpret_cast<Mr*>(m); }
inline Mw* ToMw(ibv_mw* m) { return reinterpret_cast<Mw*>(m); }
inline Ah* ToAh(ibv_ah* a) { return reinterpret_cast<Ah*>(a); }
inline Channel* ToChannel(ibv_comp_channel* c) { return reinterpret_cast<Channel*>(c); }

// The index of the interface (in this process's network namespace: the pod's) that holds
// IPv4 address `ip` (host order), or 0 when none does: the GID entries' ndev_ifindex.
uint32_t IfindexOfIp(uint32_t ip);

// fork support (memory.cc): the region registry's lock, held across fork(), and the
// child's side, which makes its copy of registered memory private and forgets the regions.
void LockRegions();
void UnlockRegions();
void PrivatizeRegionsInChild();

// Memory windows (mw.cc), the verbs_context ops ibv_alloc_mw / ibv_bind_mw / ibv_dealloc_mw
// call.
ibv_mw* AllocMw(ibv_pd* pd, ibv_mw_type type);
int BindMw(ibv_qp* qp, ibv_mw* mw, ibv_mw_bind* bind);
int DeallocMw(ibv_mw* mw);

// Queues an asynchronous event for ibv_get_async_event (device.cc). Any thread.
void PushAsyncEvent(Context* ctx, ibv_event_type type, void* element);
// Forgets the events not read yet about `element`, which is being destroyed: as the kernel
// drops a destroyed object's events, so that no ibv_get_async_event hands out a freed QP,
// CQ or SRQ (device.cc).
void DropAsyncEvents(Context* ctx, const void* element);

}  // namespace ff::verbs
