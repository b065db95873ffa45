// The library side of a test: a "pod" is a session of libffverbs (ff::verbs::OpenSession over a
// socketpair) against its own FakeRouter, with a context, a PD and a CQ, and helpers to
// bring QPs up and to wait (always bounded) for completions.
#pragma once

#include <infiniband/verbs.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "fake_router.h"
#include "session/session.h"

namespace fftest {

using Clock = std::chrono::steady_clock;
inline constexpr auto kWaitLimit = std::chrono::seconds(5);

// A router found by its socket path, as the library finds ffrouter: a scratch folder with a
// listening socket (`path()`) whose first connection (within kWaitLimit) a FakeRouter serves.
class ListeningRouter {
 public:
  ListeningRouter();
  // Listens in an existing folder `dir` (as a router that replaces another does), which
  // stays when it goes.
  explicit ListeningRouter(const std::string& dir);
  ~ListeningRouter();  // removes the socket, and the folder it made
  ListeningRouter(const ListeningRouter&) = delete;
  ListeningRouter& operator=(const ListeningRouter&) = delete;
  const std::string& dir() const { return dir_; }
  const std::string& path() const { return path_; }
  // Waits until the connection came or the wait ran out; the router serving it, or nullptr.
  FakeRouter* Accepted();

 private:
  void Listen();

  std::string dir_;
  std::string path_;
  bool own_dir_ = true;
  ff::UniqueFd listener_;
  std::thread acceptor_;
  std::unique_ptr<FakeRouter> router_;
};

// Page-aligned memory registered with the pod's PD (registration remaps whole pages).
class Buffer {
 public:
  Buffer(ibv_pd* pd, size_t bytes, int access = IBV_ACCESS_LOCAL_WRITE);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  char* data() const { return data_; }
  size_t size() const { return bytes_; }
  uint32_t lkey() const { return mr_->lkey; }
  ibv_mr* mr() const { return mr_; }
  ibv_sge Sge(size_t offset, uint32_t length) const;

 private:
  char* data_ = nullptr;
  size_t bytes_ = 0;
  size_t mapped_ = 0;
  ibv_mr* mr_ = nullptr;
};

struct QpOptions {
  ibv_qp_type type = IBV_QPT_RC;
  uint8_t rnr_retry = 7;
  uint8_t min_rnr_timer = 1;
  uint8_t max_rd_atomic = 16;
  uint8_t timeout = 14;  // RC: 4.096 us << timeout per try (0: wait forever)
  uint8_t retry_cnt = 7;
  int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
               IBV_ACCESS_REMOTE_ATOMIC;
  bool sq_sig_all = true;
  ibv_cq* send_cq = nullptr;  // default: the pod's CQ
  ibv_cq* recv_cq = nullptr;
  ibv_srq* srq = nullptr;  // receives from this SRQ
};

class Pod {
 public:
  Pod();
  ~Pod();
  Pod(const Pod&) = delete;
  Pod& operator=(const Pod&) = delete;

  FakeRouter router;
  ff::verbs::Session* session = nullptr;
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;

  // A QP in INIT.
  ibv_qp* CreateQp(const QpOptions& o = {});
  // Destroys a QP CreateQp made (and forgets it): ibv_destroy_qp's result.
  int DestroyQp(ibv_qp* qp);
  // INIT -> RTR -> RTS towards QP `dest_qpn` at 10.244.0.2 (how the fake router answers is
  // set up before). RTR's connect result is returned (0 or the errno modify_qp gave).
  int Connect(ibv_qp* qp, uint32_t dest_qpn, const QpOptions& o = {});
  ibv_cq* NewCq(int cqe = 256, ibv_comp_channel* channel = nullptr);
  // A completion channel, destroyed after the CQs.
  ibv_comp_channel* NewChannel();
  ibv_ah* NewAh();

 private:
  std::vector<ibv_qp*> qps_;
  std::vector<ibv_cq*> cqs_;
  std::vector<ibv_comp_channel*> channels_;
  std::vector<ibv_ah*> ahs_;
};

// Posts one work request (signalled).
int PostSend(ibv_qp* qp, ibv_wr_opcode op, const ibv_sge& sge, uint64_t wr_id,
             uint64_t remote_addr = 0, uint32_t rkey = 0);
int PostAtomic(ibv_qp* qp, ibv_wr_opcode op, const ibv_sge& sge, uint64_t wr_id,
               uint64_t remote_addr, uint32_t rkey, uint64_t compare_add, uint64_t swap);
int PostUdSend(ibv_qp* qp, ibv_ah* ah, const ibv_sge& sge, uint64_t wr_id, uint32_t remote_qpn,
               uint32_t qkey);
int PostRecv(ibv_qp* qp, const ibv_sge& sge, uint64_t wr_id);
int PostSrqRecv(ibv_srq* srq, const ibv_sge& sge, uint64_t wr_id);

// Polls until `n` completions arrived or kWaitLimit passed; returns what arrived.
std::vector<ibv_wc> PollN(ibv_cq* cq, size_t n);
// Polls `times` times and returns whatever arrived (for "nothing completes" checks).
std::vector<ibv_wc> PollFew(ibv_cq* cq, int times);
ibv_qp_state StateOf(ibv_qp* qp);
// Checks that `wcs` is WQE `failed` completing with IBV_WC_RETRY_EXC_ERR and then WQE
// `flushed` with IBV_WC_WR_FLUSH_ERR: a transport error and what it flushed.
void ExpectFailedThenFlushed(const std::vector<ibv_wc>& wcs, uint64_t failed, uint64_t flushed);
// The next async event, waiting at most kWaitLimit; IBV_EVENT_DEVICE_FATAL-1 style
// sentinel (-1) when none came.
int NextAsyncEvent(ibv_context* ctx, ibv_async_event* out);

}  // namespace fftest
