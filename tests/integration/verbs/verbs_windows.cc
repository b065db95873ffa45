// An ordinary verbs program (linked against the system libibverbs, run under the freeflow
// preload) that uses memory windows between two pods: the server binds a type 1 window
// (ibv_bind_mw) and two type 2 windows (IBV_WR_BIND_MW), each through its own QP; the client
// writes, reads and adds through them; then the server unbinds the type 1 window, invalidates
// one type 2 window itself (LOCAL_INV) and the client invalidates the other
// (SEND_WITH_INV); every access through them must then fail with IBV_WC_REM_ACCESS_ERR.
// The registration the windows are bound over has local write and IBV_ACCESS_MW_BIND only:
// binding a window is how its owner grants remote access.
//
//   verbs_windows PORT              the server
//   verbs_windows PORT SERVER_IP    the client (as ibv_rc_pingpong, so that scripts run
//                                   both the same way)
#include <infiniband/verbs.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "rc_pair.h"

namespace {

using rcpair::Die;

constexpr size_t kBuf = 64 * 1024;
constexpr size_t kWindowAt = 8192;  // every window covers [kWindowAt, kWindowAt + kWindowLen)
constexpr uint64_t kWindowLen = 4096;
constexpr int kQps = 3;  // 0: type 1 window; 1: type 2, LOCAL_INV; 2: type 2, SEND_WITH_INV
constexpr int kAccess = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;

struct Wire {
  uint32_t qpn[kQps];
  uint32_t rkey[kQps];  // server: the windows' keys
  uint64_t addr;        // server: its buffer
  uint8_t gid[16];
};

int failures = 0;

void Check(bool ok, const char* what) {
  std::printf("%s %s\n", ok ? "ok:" : "FAILED:", what);
  if (!ok) ++failures;
}

struct Side {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp[kQps] = {};
  ibv_mr* mr = nullptr;
  char* buf = nullptr;
  ibv_gid gid{};

  void Open() {
    ctx = rcpair::OpenFirstDevice();
    ibv_device_attr attr{};
    if (ibv_query_device(ctx, &attr) != 0) Die("query device");
    Check((attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW) &&
              (attr.device_cap_flags & IBV_DEVICE_MEM_WINDOW_TYPE_2B),
          "the device reports memory windows of type 1 and 2B");
    pd = ibv_alloc_pd(ctx);
    cq = ibv_create_cq(ctx, 256, nullptr, nullptr, 0);
    buf = static_cast<char*>(aligned_alloc(4096, kBuf));
    std::memset(buf, 0, kBuf);
    // No remote flag: as on an HCA, the windows bound over it grant remote access.
    mr = ibv_reg_mr(pd, buf, kBuf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND);
    if (pd == nullptr || cq == nullptr || mr == nullptr) Die("resources");
    for (auto& q : qp) {
      ibv_qp_init_attr init{};
      init.send_cq = cq;
      init.recv_cq = cq;
      init.qp_type = IBV_QPT_RC;
      init.sq_sig_all = 1;
      init.cap = {64, 64, 1, 1, 0};
      q = ibv_create_qp(pd, &init);
      if (q == nullptr) Die("create qp");
      rcpair::ToInit(q, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
    }
    if (ibv_query_gid(ctx, 1, 1, &gid) != 0) Die("query gid");
  }

  Wire Local() const {
    Wire w{};
    for (int i = 0; i < kQps; ++i) w.qpn[i] = qp[i]->qp_num;
    w.addr = reinterpret_cast<uintptr_t>(buf);
    std::memcpy(w.gid, gid.raw, 16);
    return w;
  }

  void Connect(const Wire& peer) {
    for (int i = 0; i < kQps; ++i) rcpair::ToRts(qp[i], peer.qpn[i], peer.gid, 7, 4);
  }

  // The next completion, within 5 s.
  ibv_wc Next() {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    ibv_wc wc{};
    while (std::chrono::steady_clock::now() < end) {
      const int n = ibv_poll_cq(cq, 1, &wc);
      if (n < 0) Die("poll_cq");
      if (n == 1) return wc;
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    wc.status = IBV_WC_GENERAL_ERR;
    wc.opcode = static_cast<ibv_wc_opcode>(-1);
    return wc;
  }

  bool Post(int q, ibv_send_wr& wr) {
    ibv_send_wr* bad = nullptr;
    return ibv_post_send(qp[q], &wr, &bad) == 0;
  }

  // An access of 8 bytes of the peer at `raddr` through `rkey` on QP `q`: its status.
  ibv_wc_status Access(int q, ibv_wr_opcode op, uint32_t rkey, uint64_t raddr) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(buf), 8, mr->lkey};
    ibv_send_wr wr{};
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = op;
    if (op == IBV_WR_ATOMIC_FETCH_AND_ADD) {
      wr.wr.atomic = {raddr, 5, 0, rkey};
    } else {
      wr.wr.rdma = {raddr, rkey};
    }
    if (!Post(q, wr)) Die("post_send");
    return Next().status;
  }
};

ibv_mw_bind_info Window(const Side& s) {
  return {s.mr, reinterpret_cast<uintptr_t>(s.buf + kWindowAt), kWindowLen, kAccess};
}

// Binds a type 2 window through QP `q`: its key, 0 when the bind failed.
uint32_t BindType2(Side& s, int q) {
  ibv_mw* mw = ibv_alloc_mw(s.pd, IBV_MW_TYPE_2);
  if (mw == nullptr) return 0;
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_BIND_MW;
  wr.bind_mw.mw = mw;
  wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
  wr.bind_mw.bind_info = Window(s);
  if (!s.Post(q, wr)) return 0;
  const ibv_wc wc = s.Next();
  return wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_BIND_MW ? wr.bind_mw.rkey : 0;
}

int Server(int port) {
  Side s;
  s.Open();
  const int sock = rcpair::Listen(port);
  Wire peer{};
  rcpair::ReadAll(sock, &peer, sizeof(peer));
  s.Connect(peer);
  ibv_mw* one = ibv_alloc_mw(s.pd, IBV_MW_TYPE_1);
  if (one == nullptr) Die("alloc_mw type 1");
  ibv_mw_bind bind{};
  bind.bind_info = Window(s);
  Check(ibv_bind_mw(s.qp[0], one, &bind) == 0 && s.Next().status == IBV_WC_SUCCESS,
        "type 1 window bound (ibv_bind_mw)");
  Wire w = s.Local();
  w.rkey[0] = one->rkey;
  w.rkey[1] = BindType2(s, 1);
  w.rkey[2] = BindType2(s, 2);
  Check(w.rkey[1] != 0 && w.rkey[2] != 0, "type 2 windows bound (IBV_WR_BIND_MW)");
  ibv_sge sge{reinterpret_cast<uintptr_t>(s.buf), 64, s.mr->lkey};
  ibv_recv_wr rwr{};
  rwr.sg_list = &sge;
  rwr.num_sge = 1;
  ibv_recv_wr* rbad = nullptr;
  if (ibv_post_recv(s.qp[2], &rwr, &rbad) != 0) Die("post_recv");
  rcpair::WriteAll(sock, &w, sizeof(w));
  char step = 0;
  rcpair::ReadAll(sock, &step, 1);  // the client used the windows and sent its SEND_WITH_INV
  const ibv_wc inv = s.Next();
  Check(inv.status == IBV_WC_SUCCESS && inv.opcode == IBV_WC_RECV &&
            (inv.wc_flags & IBV_WC_WITH_INV) && inv.invalidated_rkey == w.rkey[2],
        "the peer's SEND_WITH_INV arrived with IBV_WC_WITH_INV and the window's key");
  Check(s.buf[kWindowAt] == 'W', "the client's WRITE through the type 1 window arrived");
  Check(ibv_dereg_mr(s.mr) == EBUSY, "a registration with a bound window is busy");
  ibv_send_wr lwr{};
  lwr.opcode = IBV_WR_LOCAL_INV;
  lwr.invalidate_rkey = w.rkey[1];
  const bool posted = s.Post(1, lwr);
  const ibv_wc linv = s.Next();
  Check(posted && linv.status == IBV_WC_SUCCESS && linv.opcode == IBV_WC_LOCAL_INV,
        "LOCAL_INV of a type 2 window");
  bind.bind_info = ibv_mw_bind_info{s.mr, 0, 0, 0};
  Check(ibv_bind_mw(s.qp[0], one, &bind) == 0 && s.Next().status == IBV_WC_SUCCESS,
        "type 1 window unbound (length 0)");
  rcpair::WriteAll(sock, &step, 1);
  rcpair::ReadAll(sock, &step, 1);  // the client is done
  return failures == 0 ? 0 : 1;
}

int Client(const char* ip, int port) {
  Side c;
  c.Open();
  const int sock = rcpair::Dial(ip, port);
  const Wire mine = c.Local();
  rcpair::WriteAll(sock, &mine, sizeof(mine));
  Wire w{};
  rcpair::ReadAll(sock, &w, sizeof(w));
  c.Connect(w);
  const uint64_t at = w.addr + kWindowAt;
  std::memset(c.buf, 'W', 8);
  Check(c.Access(0, IBV_WR_RDMA_WRITE, w.rkey[0], at) == IBV_WC_SUCCESS,
        "WRITE through the type 1 window");
  Check(c.Access(0, IBV_WR_RDMA_READ, w.rkey[0], at + kWindowLen - 8) == IBV_WC_SUCCESS,
        "READ through the type 1 window");
  Check(c.Access(1, IBV_WR_ATOMIC_FETCH_AND_ADD, w.rkey[1], at + 8) == IBV_WC_SUCCESS,
        "FETCH_ADD through a type 2 window");
  Check(c.Access(2, IBV_WR_RDMA_READ, w.rkey[2], at) == IBV_WC_SUCCESS,
        "READ through the other type 2 window");
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_SEND_WITH_INV;
  wr.invalidate_rkey = w.rkey[2];
  Check(c.Post(2, wr) && c.Next().status == IBV_WC_SUCCESS, "SEND_WITH_INV sent");
  char step = 1;
  rcpair::WriteAll(sock, &step, 1);
  rcpair::ReadAll(sock, &step, 1);  // the server invalidated and unbound the others
  Check(c.Access(0, IBV_WR_RDMA_READ, w.rkey[0], at) == IBV_WC_REM_ACCESS_ERR,
        "READ through the unbound type 1 window fails");
  Check(c.Access(1, IBV_WR_RDMA_WRITE, w.rkey[1], at) == IBV_WC_REM_ACCESS_ERR,
        "WRITE through the locally invalidated type 2 window fails");
  Check(c.Access(2, IBV_WR_RDMA_READ, w.rkey[2], at) == IBV_WC_REM_ACCESS_ERR,
        "READ through the remotely invalidated type 2 window fails");
  rcpair::WriteAll(sock, &step, 1);
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2) return Server(std::atoi(argv[1]));
  if (argc == 3) return Client(argv[2], std::atoi(argv[1]));
  std::fprintf(stderr, "usage: verbs_windows PORT [SERVER_IP]\n");
  return 2;
}
