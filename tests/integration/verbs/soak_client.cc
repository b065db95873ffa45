// One pod process of the router soak (soak.sh), run under the freeflow preload: it opens the
// device, creates a completion channel, a CQ, two RC QPs and two MRs, connects the two QPs to
// each other (through the router, as two pods would) and then moves data between them in a
// loop: RDMA WRITE, SEND/RECV, RDMA READ. The soak kills it with SIGKILL at a random point;
// left alone it stops after SECONDS.
//
//   soak_client SECONDS [KILL_AT]
//
// It prints its progress ("opened", "registered", "connected", "looping") so that the soak
// can tell where its kills landed. With KILL_AT it sends itself SIGKILL right after step
// KILL_AT (1: device open, 2-4: PD, channel, CQ, 5-8: MRs and QPs, 9-13: INIT, RTR/RTS,
// 14 on: each round of the loop, with work in flight), so that every step is hit exactly.
#include <infiniband/verbs.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "rc_pair.h"

namespace {

constexpr size_t kBytes = 256 * 1024;
constexpr int kDepth = 16;

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "soak_client: %s failed: %s\n", what, std::strerror(errno));
  std::exit(2);
}

void Stage(const char* name) {
  std::printf("%s\n", name);
  std::fflush(stdout);
}

int g_kill_at = -1;
int g_step = 0;

// One step done: the process dies here if the soak picked this step.
void Step() {
  if (++g_step != g_kill_at) return;
  std::printf("killed at step %d\n", g_step);
  std::fflush(stdout);
  ::raise(SIGKILL);
}

struct Side {
  ibv_qp* qp = nullptr;
  ibv_mr* mr = nullptr;
  std::vector<char> memory = std::vector<char>(kBytes);
};

void ToInit(ibv_qp* qp) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
    Fail("modify to INIT");
}

// RTR towards `peer_qpn` at this process's own address, then RTS.
void ToRts(ibv_qp* qp, uint32_t peer_qpn, const ibv_gid& gid) {
  rcpair::ToRts(qp, peer_qpn, gid.raw, 7, 1);
}

void PostRecv(Side& s) {
  ibv_sge sge{reinterpret_cast<uintptr_t>(s.memory.data()), 4096, s.mr->lkey};
  ibv_recv_wr wr{};
  ibv_recv_wr* bad = nullptr;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  if (ibv_post_recv(s.qp, &wr, &bad)) Fail("post_recv");
}

// One signaled work request from `from` to `to`'s memory.
void Post(Side& from, const Side& to, ibv_wr_opcode op, uint32_t len) {
  ibv_sge sge{reinterpret_cast<uintptr_t>(from.memory.data()), len, from.mr->lkey};
  ibv_send_wr wr{};
  ibv_send_wr* bad = nullptr;
  wr.opcode = op;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(to.memory.data());
  wr.wr.rdma.rkey = to.mr->rkey;
  if (ibv_post_send(from.qp, &wr, &bad)) Fail("post_send");
}

// Waits (bounded) for `n` completions.
void Reap(ibv_cq* cq, int n) {
  ibv_wc wc[kDepth];
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (n > 0) {
    const int got = ibv_poll_cq(cq, kDepth, wc);
    if (got < 0) Fail("poll_cq");
    for (int i = 0; i < got; ++i)
      if (wc[i].status != IBV_WC_SUCCESS) Fail(ibv_wc_status_str(wc[i].status));
    n -= got;
    if (std::chrono::steady_clock::now() > end) Fail("waiting for completions");
  }
}

}  // namespace

int main(int argc, char** argv) {
  const int seconds = argc > 1 ? std::atoi(argv[1]) : 10;
  g_kill_at = argc > 2 ? std::atoi(argv[2]) : -1;
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr || n == 0) Fail("ibv_get_device_list");
  ibv_context* ctx = ibv_open_device(list[0]);
  if (ctx == nullptr) Fail("ibv_open_device");
  Stage("opened");
  Step();
  ibv_pd* pd = ibv_alloc_pd(ctx);
  Step();
  ibv_comp_channel* channel = ibv_create_comp_channel(ctx);
  Step();
  ibv_cq* cq = channel != nullptr ? ibv_create_cq(ctx, 4 * kDepth, nullptr, channel, 0) : nullptr;
  if (pd == nullptr || cq == nullptr) Fail("creating PD, channel and CQ");
  Step();
  Side a, b;
  for (Side* s : {&a, &b}) {
    s->mr = ibv_reg_mr(pd, s->memory.data(), kBytes,
                       IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
    Step();
    ibv_qp_init_attr init{};
    init.send_cq = cq;
    init.recv_cq = cq;
    init.qp_type = IBV_QPT_RC;
    init.cap = {kDepth, kDepth, 1, 1, 0};
    s->qp = ibv_create_qp(pd, &init);
    if (s->mr == nullptr || s->qp == nullptr) Fail("registering memory and creating QPs");
    Step();
  }
  ToInit(a.qp);
  Step();
  ToInit(b.qp);
  Step();
  Stage("registered");
  ibv_gid gid{};
  if (ibv_query_gid(ctx, 1, 1, &gid)) Fail("ibv_query_gid");
  Step();
  ToRts(a.qp, b.qp->qp_num, gid);
  Step();
  ToRts(b.qp, a.qp->qp_num, gid);
  Stage("connected");
  Step();
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  for (int round = 0; std::chrono::steady_clock::now() < end; ++round) {
    PostRecv(b);
    Post(a, b, IBV_WR_RDMA_WRITE, kBytes);
    Post(a, b, IBV_WR_SEND, 4096);
    Post(b, a, IBV_WR_RDMA_READ, 64 * 1024);
    Step();  // with the three in flight
    Reap(cq, 4);
    if (round == 0) Stage("looping");
  }
  return 0;
}
