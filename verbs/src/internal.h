// Private state of libffverbs, the library a pod loads with LD_PRELOAD.
//
// Threading: every data-path structure of a context (QPs, CQs, SRQs and their queues) is
// guarded by that context's spinlock `Context::lock`; verbs take it for their whole body
// and never block while holding it. The event thread never takes it: it only raises
// atomics (`Qp::peer_gone`, `Context::attention`) that the data path acts on.
//
// Buffer ownership: a send WQE refers to the application's buffers until its completion
// is generated (inline data is copied at post time). Receive buffers are written only by
// the owning process, when it drains its rings in poll_cq.
#pragma once

#include <infiniband/verbs.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "freeflow/codec.h"
#include "freeflow/fd.h"
#include "freeflow/protocol.h"
#include "freeflow/ring.h"
#include "freeflow/shm_layout.h"
#include "freeflow/target_ops.h"
#include "freeflow/tunables.h"

namespace ffv {

using ff::Mapping;
using ff::UniqueFd;

// Logging that keeps errno intact. FFV_LOG=debug enables debug lines; errors always print.
void LogError(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void LogDebug(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

class SpinLock {
 public:
  void lock() {
    while (flag_.exchange(true, std::memory_order_acquire)) {
      while (flag_.load(std::memory_order_relaxed)) __builtin_ia32_pause();
    }
  }
  void unlock() { flag_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> flag_{false};
};

struct Context;
struct Qp;
struct Cq;

// What the process learnt from the router at HELLO, plus the connection itself.
struct Session {
  UniqueFd sock;
  UniqueFd events;
  std::mutex call_mu;  // one request in flight at a time
  uint32_t seq = 0;
  uint32_t ctx_id = 0;
  uint32_t ip = 0;  // host byte order
  uint16_t lid = 0;
  std::string node;
  std::string socket_path;
  UniqueFd notify_fd;
  Mapping notify;  // our NotifySlot array
  UniqueFd wake_fd;  // rung by the router after cross-node deliveries (see kWakeSlot)
  Mapping mr_table;
  std::atomic<bool> fatal{false};
  std::thread event_thread;

  // Synchronous request. Returns 0 or a positive errno. fds_out receive ownership.
  int Call(const void* req, size_t len, const int* fds, int nfds, ff::proto::Response* resp,
           UniqueFd* fds_out = nullptr, int max_fds_out = 0, int* nfds_out = nullptr);
};

// The shared process-wide runtime: the one device and its router session.
Session* GetSession();  // nullptr when the router cannot be reached

struct PeerCtx {
  uint32_t ctx_id = 0;
  Mapping notify;
  Mapping mr_table;
  std::unordered_map<uint32_t, Mapping> regions;
  uint32_t last_region = ~0u;
  Mapping* last_mapping = nullptr;
};

// The sending side of a connection: a ring of the peer QP we produce into.
struct PeerLink {
  uint32_t peer_ctx_id = 0;
  uint32_t peer_qpn = 0;
  uint32_t peer_ip = 0;  // host byte order
  uint16_t peer_lid = 0;
  uint32_t qp_type = 0;
  Mapping seg;
  Mapping srq_seg;
  ff::QpSegmentHeader* hdr = nullptr;
  ff::RecvCredits* credits = nullptr;
  uint64_t posted_cache = 0;
  ff::RingProducer producer;
  ff::NotifySlot* notify = nullptr;
  UniqueFd notify_fd;
  std::shared_ptr<PeerCtx> pctx;
  bool dead = false;
  bool dirty = false;  // records committed but not yet published
  // A peer on another node: requests go into the router's proxy ring (producer), and
  // the router's responses come back on `responses`.
  bool remote = false;
  ff::RingConsumer responses;
};

struct Pd {
  ibv_pd pd;
};

struct Region {
  uint32_t id = 0;
  uintptr_t start = 0;
  size_t size = 0;
  UniqueFd fd;
  int refs = 0;
};

struct Mr {
  ibv_mr mr;
  uint64_t iova = 0;
  int access = 0;
  Region* region = nullptr;
};

struct Channel {
  ibv_comp_channel ch;
  uint32_t id = 0;
  Context* ctx = nullptr;
  std::vector<Cq*> cqs;
};

struct Cq {
  ibv_cq cq;
  uint32_t id = 0;
  Context* ctx = nullptr;
  std::vector<ibv_wc> wcs;  // ring of completions, power-of-two size
  uint32_t mask = 0;
  uint64_t head = 0, tail = 0;
  uint32_t capacity = 0;  // what the user asked for (cqe)
  Channel* channel = nullptr;
  uint32_t notify_slot = ff::proto::kNoId;
  std::vector<Qp*> recv_qps;
  bool overflowed = false;
  uint32_t events_acked = 0;
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
  // UD
  uint32_t dest_ip;
  uint16_t dest_lid;
  uint32_t remote_qpn, remote_qkey;
  // progress
  uint64_t sent;
  bool credit;
  bool started;
  ff::RnrState rnr;
  uint32_t pre_status;  // ibv_wc_status found at post time (bad lkey, ...)
  uint8_t phase;        // remote WRITE_WITH_IMM: 1 once the data records are out
  bool in_flight;       // sent to a remote peer, waiting for its response
  bool done;            // outcome known (status), waiting to be retired in order
  uint32_t status;
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

enum class PeerGone : uint32_t { kNo = 0, kDestroyed = 1, kDied = 2 };

struct Qp {
  ibv_qp_ex qpx;  // must stay first: ibv_qp* <-> Qp*
  Context* ctx = nullptr;
  ibv_qp_type type = IBV_QPT_RC;
  Cq* scq = nullptr;
  Cq* rcq = nullptr;
  Srq* srq = nullptr;
  ibv_qp_attr attr{};
  ibv_qp_cap cap{};
  bool sq_sig_all = false;
  uint64_t send_ops_flags = 0;

  // Inbound: our own segment and one consumer per ring.
  UniqueFd seg_fd;
  Mapping seg;
  uint32_t num_rings = 0, ring_bytes = 0;
  std::vector<ff::RingConsumer> consumers;
  std::vector<InboundState> inbound;
  InboundState imm_scratch;  // receive WQE of a WRITE_WITH_IMM being completed
  RecvQueue rq;  // unused with an SRQ

  // Outbound.
  std::unique_ptr<PeerLink> link;                                    // RC/UC
  std::unordered_map<uint64_t, std::unique_ptr<PeerLink>> ud_links;  // UD: ip<<32|qpn
  std::vector<SendWqe> sq;
  std::vector<ibv_sge> sq_sges;
  std::vector<char> sq_inline;
  uint32_t sq_mask = 0;
  // sq_head: oldest WQE not yet completed; sq_exec: next to execute; sq_tail: next free.
  uint64_t sq_head = 0, sq_exec = 0, sq_tail = 0;
  uint32_t remote_inflight = 0;
  uint32_t remote_reads = 0;  // in-flight remote READ/ATOMIC, limited by max_rd_atomic
  bool in_pending_list = false;

  std::atomic<uint32_t> peer_gone{0};  // PeerGone, raised by the event thread

  // ibv_wr_* state between wr_start and wr_complete.
  std::vector<ibv_send_wr> wr_batch;
  std::vector<ibv_sge> wr_sges;
  std::vector<char> wr_inline;
  std::vector<size_t> wr_sge_begin;      // per batched WR: first index in wr_sges
  std::vector<size_t> wr_inline_begin;   // per batched WR: first byte in wr_inline, or npos
  int wr_error = 0;
};

struct AsyncEvent {
  ibv_event_type type;
  void* element;  // ibv_qp*, ibv_cq*, ibv_srq* or nullptr
};

struct Context {
  verbs_context vctx;  // must stay first; ibv_context is its last member
  Session* session = nullptr;
  SpinLock lock;
  std::atomic<bool> attention{false};
  std::vector<Qp*> qps;
  std::vector<Qp*> pending;  // QPs with queued send WQEs
  std::vector<Cq*> cqs;
  std::vector<Srq*> srqs;
  std::vector<Channel*> channels;
  std::unordered_map<uint32_t, std::weak_ptr<PeerCtx>> peers;
  std::vector<Mr*> mrs_by_slot;  // local lkey lookup
  const Mr* last_mr = nullptr;   // the registration the last SGE check found (one-entry cache)
  uint32_t next_id = 1;
  // Links to peers on other nodes: their data moves only when the routers run, so a poll
  // that finds nothing yields the CPU (on one node nothing else needs it).
  uint32_t remote_links = 0;
  // Async events.
  std::mutex async_mu;
  std::deque<AsyncEvent> async_events;
  UniqueFd async_fd;
};

inline Context* ToCtx(ibv_context* c) {
  return reinterpret_cast<Context*>(verbs_get_ctx(c));
}
inline Qp* ToQp(ibv_qp* q) { return reinterpret_cast<Qp*>(q); }
inline Cq* ToCq(ibv_cq* c) { return reinterpret_cast<Cq*>(c); }
inline Srq* ToSrq(ibv_srq* s) { return reinterpret_cast<Srq*>(s); }
inline Mr* ToMr(ibv_mr* m) { return reinterpret_cast<Mr*>(m); }
inline Ah* ToAh(ibv_ah* a) { return reinterpret_cast<Ah*>(a); }
inline Channel* ToChannel(ibv_comp_channel* c) { return reinterpret_cast<Channel*>(c); }

// Device and context (device.cc).
void PushAsyncEvent(Context* ctx, ibv_event_type type, void* element);

// Data path (datapath.cc).
int PostSend(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad);
int PostRecv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad);
int PostSrqRecv(ibv_srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad);
int PollCq(ibv_cq* cq, int n, ibv_wc* wc);
int ReqNotifyCq(ibv_cq* cq, int solicited_only);
void FailQp(Qp* qp, ibv_wc_status first_send_status);  // ctx->lock held
void FlushRecvs(Qp* qp);                                 // ctx->lock held
void ProgressPending(Context* ctx);                       // ctx->lock held
void ResetQueues(Qp* qp);                                 // ctx->lock held
void WakeCq(Cq* cq);
void InitQpEx(Qp* qp);

// Peer connections (resources.cc).
int ConnectLink(Qp* qp, uint32_t dest_ip, uint16_t dest_lid, uint32_t dest_qpn, bool ud,
                std::unique_ptr<PeerLink>* out);
Mapping* PeerRegion(Qp* qp, PeerLink* link, uint32_t region_id);

}  // namespace ffv
