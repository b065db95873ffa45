// The fixture of the cluster tests: pods, each a library session with its verbs objects,
// on one router or on two routers joined by the in-memory node transport.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "harness.h"
#include "session/session.h"

namespace ff::cluster_test {

using router::LoopbackNetwork;
using router::test::FakeCluster;
using router::test::Ip;
using router::test::TestRouter;

constexpr int kAllAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                           IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
constexpr size_t kBufferBytes = 1 << 20;

// One pod: a library session on `router` with overlay address `ip`, a context, a PD, a CQ
// (with a completion channel when asked), an RC QP and a registered buffer.
class Pod {
 public:
  Pod(TestRouter& router, uint32_t ip, bool with_channel = false) : ip_(ip) {
    int error = 0;
    session_ = ff::verbs::OpenSession(router.Connect(ip), "test router", &error);
    if (session_ == nullptr) throw std::runtime_error("OpenSession: " + std::to_string(error));
    ctx = ff::verbs::OpenContext(session_);
    pd = ibv_alloc_pd(ctx);
    if (with_channel) channel = ibv_create_comp_channel(ctx);
    cq = ibv_create_cq(ctx, 1024, nullptr, channel, 0);
    buf = static_cast<char*>(
        ::mmap(nullptr, kBufferBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    mr = ibv_reg_mr(pd, buf, kBufferBytes, kAllAccess);
    qp = CreateRcQp();
    if (ctx == nullptr || pd == nullptr || cq == nullptr || mr == nullptr || qp == nullptr)
      throw std::runtime_error("cannot set up the pod's verbs objects");
  }
  ~Pod() {
    for (ibv_qp* q : extra_qps_) ibv_destroy_qp(q);
    ibv_destroy_qp(qp);
    ibv_dereg_mr(mr);
    ::munmap(buf, kBufferBytes);
    ibv_destroy_cq(cq);
    if (channel != nullptr) ibv_destroy_comp_channel(channel);
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
    ff::verbs::CloseSession(session_);
  }
  Pod(const Pod&) = delete;
  Pod& operator=(const Pod&) = delete;

  // Destroys a QP NewQp made.
  int DestroyQp(ibv_qp* q) {
    std::erase(extra_qps_, q);
    return ibv_destroy_qp(q);
  }

  // INIT -> RTR -> RTS towards `peer`, addressed by its GID (the overlay address), or by
  // its LID only (`lid` != 0: no GRH, as InfiniBand programs address a peer).
  int ConnectTo(const Pod& peer, uint8_t rnr_retry = 7, uint8_t min_rnr_timer = 1,
                uint16_t lid = 0) {
    return ConnectQp(qp, peer, peer.qp->qp_num, rnr_retry, min_rnr_timer, lid);
  }

  // Another RC QP of this pod, on its PD and CQ (destroyed with the pod).
  ibv_qp* NewQp() {
    ibv_qp* q = CreateRcQp();
    if (q != nullptr) extra_qps_.push_back(q);
    return q;
  }

  // a's access of `len` bytes at `remote` through `rkey` on `through` (the pod's QP when
  // nullptr), from or into its buffer at `offset`: the completion's status.
  ibv_wc_status Access(ibv_wr_opcode op, uint32_t rkey, uint64_t remote, size_t offset,
                       uint32_t len, ibv_qp* through = nullptr) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(buf + offset), len, mr->lkey};
    ibv_send_wr wr{};
    wr.wr_id = 5;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = op;
    if (op == IBV_WR_ATOMIC_FETCH_AND_ADD) {
      wr.wr.atomic = {remote, 1, 0, rkey};
    } else {
      wr.wr.rdma = {remote, rkey};
    }
    ibv_send_wr* bad = nullptr;
    if (ibv_post_send(through != nullptr ? through : qp, &wr, &bad) != 0) return IBV_WC_GENERAL_ERR;
    const auto wc = Poll(1);
    return wc.size() == 1 ? wc[0].status : IBV_WC_GENERAL_ERR;
  }

  // Connects `own`, a QP of this pod, to QP `peer_qpn` of `peer`.
  int ConnectQp(ibv_qp* own, const Pod& peer, uint32_t peer_qpn, uint8_t rnr_retry = 7,
                uint8_t min_rnr_timer = 1, uint16_t lid = 0) {
    return ConnectQp(own, peer.ip_, peer_qpn, rnr_retry, min_rnr_timer, lid);
  }
  // The same towards QP `peer_qpn` of the pod at `peer_ip` (one that is not a Pod).
  int ConnectQp(ibv_qp* own, uint32_t peer_ip, uint32_t peer_qpn, uint8_t rnr_retry = 7,
                uint8_t min_rnr_timer = 1, uint16_t lid = 0) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = kAllAccess;
    if (int rc = ibv_modify_qp(
            own, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
      return rc;
    a = {};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_4096;
    a.dest_qp_num = peer_qpn;
    a.max_dest_rd_atomic = 16;
    a.min_rnr_timer = min_rnr_timer;
    a.ah_attr.is_global = lid == 0;
    a.ah_attr.dlid = lid;
    a.ah_attr.port_num = 1;
    a.ah_attr.grh.sgid_index = 1;
    if (lid == 0) Ipv4MappedGid(peer_ip, a.ah_attr.grh.dgid.raw);
    if (int rc =
            ibv_modify_qp(own, &a,
                          IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                              IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
      return rc;
    a = {};
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = rnr_retry;
    a.max_rd_atomic = 16;
    return ibv_modify_qp(own, &a,
                         IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                             IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC);
  }

  // Posts a receive of [offset, offset + len) of the buffer on `on` (the pod's QP when nullptr).
  int PostRecv(uint64_t wr_id, size_t offset, uint32_t len, ibv_qp* on = nullptr) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(buf + offset), len, mr->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    return ibv_post_recv(on != nullptr ? on : qp, &wr, &bad);
  }

  // Posts one work request whose local buffer is [offset, offset + len).
  int Post(ibv_wr_opcode op, uint64_t wr_id, size_t offset, uint32_t len,
           const Pod* target = nullptr, uint64_t remote_offset = 0, uint64_t compare_add = 0,
           uint64_t swap = 0) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(buf + offset), len, mr->lkey};
    ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = op;
    wr.send_flags = send_flags;
    if (op == IBV_WR_ATOMIC_FETCH_AND_ADD || op == IBV_WR_ATOMIC_CMP_AND_SWP) {
      wr.wr.atomic.remote_addr = reinterpret_cast<uintptr_t>(target->buf + remote_offset);
      wr.wr.atomic.rkey = target->mr->rkey;
      wr.wr.atomic.compare_add = compare_add;
      wr.wr.atomic.swap = swap;
    } else if (target != nullptr) {
      wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(target->buf + remote_offset);
      wr.wr.rdma.rkey = target->mr->rkey;
    }
    ibv_send_wr* bad = nullptr;
    return ibv_post_send(qp, &wr, &bad);
  }

  // Polls until `n` completions arrived or `limit` passed.
  std::vector<ibv_wc> Poll(size_t n, std::chrono::milliseconds limit = std::chrono::seconds(5)) {
    std::vector<ibv_wc> got;
    const auto end = std::chrono::steady_clock::now() + limit;
    while (got.size() < n && std::chrono::steady_clock::now() < end) {
      ibv_wc wc[16];
      const int k = ibv_poll_cq(cq, 16, wc);
      if (k < 0) break;
      got.insert(got.end(), wc, wc + k);
    }
    return got;
  }

  // The next asynchronous event, within 5 s.
  std::optional<ibv_event_type> AsyncEvent() {
    pollfd p{ctx->async_fd, POLLIN, 0};
    if (::poll(&p, 1, 5000) <= 0) return std::nullopt;
    ibv_async_event e;
    if (ibv_get_async_event(ctx, &e) != 0) return std::nullopt;
    ibv_ack_async_event(&e);
    return e.event_type;
  }

  ff::verbs::Session* session() const { return session_; }

  // The process dies: the router sees its connection close with everything still open.
  void Die() { ::shutdown(session_->sock.get(), SHUT_RDWR); }

  ibv_context* ctx = nullptr;
  ibv_comp_channel* channel = nullptr;
  unsigned send_flags = 0;  // of the work requests Post() makes (sq_sig_all signals them)
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
  ibv_mr* mr = nullptr;
  char* buf = nullptr;

 private:
  ibv_qp* CreateRcQp() {
    ibv_qp_init_attr init{};
    init.send_cq = cq;
    init.recv_cq = cq;
    init.qp_type = IBV_QPT_RC;
    init.sq_sig_all = 1;
    init.cap = {256, 256, 4, 4, 64};
    return ibv_create_qp(pd, &init);
  }

  uint32_t ip_;
  std::vector<ibv_qp*> extra_qps_;
  ff::verbs::Session* session_ = nullptr;
};

// Checks one completion's work request, status and opcode.
inline void ExpectWc(const ibv_wc& wc, uint64_t wr_id, ibv_wc_status status, ibv_wc_opcode opcode) {
  EXPECT_EQ(wc.wr_id, wr_id);
  EXPECT_EQ(wc.status, status) << ibv_wc_status_str(wc.status);
  EXPECT_EQ(wc.opcode, opcode);
}

// Same node (false) or across nodes (true).
class ClusterTest : public ::testing::TestWithParam<bool> {
 protected:
  ClusterTest() {
    a_router = std::make_unique<TestRouter>(
        TestRouter::Options{"node-a", Ip("192.168.0.1"), &net, &cluster});
    b_router = std::make_unique<TestRouter>(
        TestRouter::Options{"node-b", Ip("192.168.0.2"), &net, &cluster});
    a = std::make_unique<Pod>(*a_router, Ip("10.1.0.1"));
    b = std::make_unique<Pod>(cross() ? *b_router : *a_router, Ip("10.2.0.1"));
  }
  bool cross() const { return GetParam(); }
  void ConnectBoth(uint8_t rnr_retry = 7, uint8_t min_rnr_timer = 1) {
    ASSERT_EQ(b->ConnectTo(*a), 0);
    ASSERT_EQ(a->ConnectTo(*b, rnr_retry, min_rnr_timer), 0);
  }
  // A new QP of a connected to a new QP of b (both on their pod's PD and CQ): for an access
  // that fails and moves its pair to ERR. nullptr when it could not be made.
  ibv_qp* NewPair() {
    ibv_qp* from = a->NewQp();
    ibv_qp* to = b->NewQp();
    if (from == nullptr || to == nullptr || b->ConnectQp(to, *a, from->qp_num) != 0 ||
        a->ConnectQp(from, *b, to->qp_num) != 0)
      return nullptr;
    return from;
  }

  LoopbackNetwork net;
  FakeCluster cluster;
  std::unique_ptr<TestRouter> a_router, b_router;
  std::unique_ptr<Pod> a, b;
};

}  // namespace ff::cluster_test
