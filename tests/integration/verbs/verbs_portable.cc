// Verbs a portable program uses beyond the basics, with real traffic between two pods (or
// two nodes): extended CQs (ibv_create_cq_ex with every advertised wc_flags field, the
// ibv_start_poll family, completion events on an extended CQ), and fork() after registering
// memory. Linked against the system libibverbs, run under the freeflow preload.
//
//   verbs_portable server PORT MODE      MODE: cqex | fork
//   verbs_portable client IP PORT MODE
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <infiniband/verbs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "rc_pair.h"

namespace {

constexpr size_t kBuf = 64 * 1024;
constexpr uint32_t kMsgs = 64;     // client -> server: half SEND_WITH_IMM, half WRITE_WITH_IMM
constexpr uint32_t kReplies = 16;  // server -> client SENDs
constexpr uint64_t kWcFlags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_IMM | IBV_WC_EX_WITH_QP_NUM |
                              IBV_WC_EX_WITH_SRC_QP | IBV_WC_EX_WITH_SLID | IBV_WC_EX_WITH_SL |
                              IBV_WC_EX_WITH_DLID_PATH_BITS;
using Clock = std::chrono::steady_clock;

int g_failures = 0;

using rcpair::Die;
using rcpair::ReadAll;
using rcpair::WriteAll;

void Check(bool ok, const std::string& what) {
  if (!ok) {
    std::printf("FAIL %s\n", what.c_str());
    ++g_failures;
  }
}

char Exchange(int fd, char mine) {
  char theirs = 0;
  WriteAll(fd, &mine, 1);
  ReadAll(fd, &theirs, 1);
  return theirs;
}

struct Wire {
  uint32_t qpn;
  uint32_t rkey;
  uint64_t addr;
  uint8_t gid[16];
};

struct Cqe {
  uint64_t wr_id;
  ibv_wc_status status;
  ibv_wc_opcode opcode;
  uint32_t byte_len, qp_num, src_qp, slid;
  __be32 imm;
  unsigned int flags;
  uint8_t sl, path_bits;
};

// One end: a context whose only CQ is extended (with a channel on the event-driven side),
// one RC QP and one registered buffer.
struct Side {
  ibv_context* ctx = nullptr;
  ibv_comp_channel* ch = nullptr;
  ibv_cq_ex* cqx = nullptr;
  ibv_gid gid{};
  ibv_pd* pd = nullptr;
  ibv_qp* qp = nullptr;
  char* buf = nullptr;
  ibv_mr* mr = nullptr;

  void Open(bool events) {
    ctx = rcpair::OpenFirstDevice();
    pd = ibv_alloc_pd(ctx);
    if (events && (ch = ibv_create_comp_channel(ctx)) == nullptr) Die("channel");
    ibv_cq_init_attr_ex ca{};
    ca.cqe = 256;
    ca.channel = ch;
    ca.wc_flags = kWcFlags;
    ca.comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS;
    ca.flags = IBV_CREATE_CQ_ATTR_SINGLE_THREADED;
    cqx = ibv_create_cq_ex(ctx, &ca);
    if (cqx == nullptr) Die("ibv_create_cq_ex");
    buf = static_cast<char*>(std::aligned_alloc(4096, kBuf));
    std::memset(buf, 0, kBuf);
    mr = ibv_reg_mr(pd, buf, kBuf,
                    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
    if (pd == nullptr || mr == nullptr) Die("pd/mr");
    ibv_cq* cq = ibv_cq_ex_to_cq(cqx);
    qp = rcpair::NewRcQp(pd, cq, cq, 128, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
    if (ibv_query_gid(ctx, 1, 1, &gid) != 0) Die("query gid");
  }

  Wire Local() const {
    Wire w{qp->qp_num, mr->rkey, reinterpret_cast<uintptr_t>(buf), {}};
    std::memcpy(w.gid, gid.raw, 16);
    return w;
  }

  void Connect(const Wire& peer) { rcpair::ToRts(qp, peer.qpn, peer.gid, 7, 4); }

  ibv_sge Sge(uint32_t off, uint32_t len) const {
    return {reinterpret_cast<uintptr_t>(buf) + off, len, mr->lkey};
  }

  void PostRecv(uint64_t id, uint32_t off, uint32_t len) {
    ibv_sge sge = Sge(off, len);
    ibv_recv_wr wr{id, nullptr, &sge, 1};
    ibv_recv_wr* bad = nullptr;
    if (ibv_post_recv(qp, &wr, &bad) != 0) Die("post recv");
  }

  void PostSend(ibv_wr_opcode op, uint64_t id, uint32_t off, uint32_t len, uint32_t imm,
                uint64_t raddr = 0, uint32_t rkey = 0) {
    ibv_sge sge = Sge(off, len);
    ibv_send_wr wr{id, nullptr, &sge, 1, op, IBV_SEND_SIGNALED, {htonl(imm)}, {}, {}, {}};
    wr.wr.rdma = {raddr, rkey};
    ibv_send_wr* bad = nullptr;
    if (ibv_post_send(qp, &wr, &bad) != 0) Die("post send");
  }

  Cqe Read() const {
    return Cqe{cqx->wr_id,
               cqx->status,
               ibv_wc_read_opcode(cqx),
               ibv_wc_read_byte_len(cqx),
               ibv_wc_read_qp_num(cqx),
               ibv_wc_read_src_qp(cqx),
               ibv_wc_read_slid(cqx),
               ibv_wc_read_imm_data(cqx),
               ibv_wc_read_wc_flags(cqx),
               ibv_wc_read_sl(cqx),
               ibv_wc_read_dlid_path_bits(cqx)};
  }

  // `n` completions through start_poll/next_poll/end_poll; with a channel, sleeping in
  // ibv_get_cq_event whenever the CQ is empty. Bounded by 20 s.
  std::vector<Cqe> Collect(size_t n) {
    std::vector<Cqe> out;
    ibv_poll_cq_attr attr{};
    const auto end = Clock::now() + std::chrono::seconds(20);
    bool armed = false;
    while (out.size() < n && Clock::now() < end) {
      const int rc = ibv_start_poll(cqx, &attr);
      if (rc == 0) {
        do out.push_back(Read());
        while (ibv_next_poll(cqx) == 0);
        ibv_end_poll(cqx);
        armed = false;
        continue;
      }
      if (rc != ENOENT) Die("ibv_start_poll");
      if (ch == nullptr) continue;
      if (!armed) {  // arm, then look once more before sleeping
        if (ibv_req_notify_cq(ibv_cq_ex_to_cq(cqx), 0) != 0) Die("req_notify");
        armed = true;
        continue;
      }
      ibv_cq* ev = nullptr;
      void* ev_ctx = nullptr;
      if (ibv_get_cq_event(ch, &ev, &ev_ctx) != 0) Die("get_cq_event");
      Check(ev == ibv_cq_ex_to_cq(cqx), "the event names the extended CQ");
      ibv_ack_cq_events(ev, 1);
      armed = false;
    }
    return out;
  }
};

Wire Meet(int sock, Side& me) {
  const Wire mine = me.Local();
  Wire peer{};
  WriteAll(sock, &mine, sizeof(mine));
  ReadAll(sock, &peer, sizeof(peer));
  me.Connect(peer);
  return peer;
}

uint32_t MsgLen(uint32_t i) { return 1 + i * 15; }  // < kSlot
constexpr uint32_t kSlot = 1024;  // receive slot i at i * kSlot; writes land past kHalf
constexpr uint32_t kHalf = 32 * 1024;

// Server side of cqex: every completion of the client's SENDs and WRITE_WITH_IMMs, read
// through the extended CQ's accessors, then replies.
int CqexServer(int sock, Side& me, const Wire& peer) {
  // SENDs land in slot i (< 32); WRITE_WITH_IMM i (>= 32) writes slot i in the upper half
  // and consumes receive i without touching its buffer.
  for (uint32_t i = 0; i < kMsgs; ++i) me.PostRecv(i, (i % 32) * kSlot, kSlot);
  Exchange(sock, 'R');
  const std::vector<Cqe> got = me.Collect(kMsgs);
  Check(got.size() == kMsgs,
        "all 64 receive completions arrived (" + std::to_string(got.size()) + ")");
  for (uint32_t i = 0; i < got.size(); ++i) {
    const Cqe& c = got[i];
    const bool send = i < kMsgs / 2;
    const std::string at = "completion " + std::to_string(i);
    Check(c.status == IBV_WC_SUCCESS, at + ": success");
    Check(c.wr_id == i, at + ": receives complete in the order posted");
    Check(c.opcode == (send ? IBV_WC_RECV : IBV_WC_RECV_RDMA_WITH_IMM), at + ": opcode");
    Check(c.byte_len == MsgLen(i), at + ": byte_len");
    Check(c.imm == htonl(1000 + i), at + ": immediate data");
    Check((c.flags & IBV_WC_WITH_IMM) != 0, at + ": IBV_WC_WITH_IMM");
    Check(c.qp_num == me.qp->qp_num, at + ": qp_num");
    Check(c.sl == 0 && c.path_bits == 0, at + ": sl and dlid_path_bits");
    const char* data = me.buf + (send ? i * kSlot : kHalf + (i - 32) * kSlot);
    bool intact = true;
    for (uint32_t k = 0; k < MsgLen(i); ++k) intact = intact && data[k] == static_cast<char>(i);
    Check(intact, at + ": payload (first byte " + std::to_string(int(data[0])) + ")");
  }
  for (uint32_t i = 0; i < kReplies; ++i) {
    std::memset(me.buf + i * kSlot, 0x40 + static_cast<int>(i), 100);
    me.PostSend(IBV_WR_SEND, 500 + i, i * kSlot, 100, 0);
  }
  const std::vector<Cqe> sent = me.Collect(kReplies);
  Check(sent.size() == kReplies, "reply send completions");
  for (const Cqe& c : sent) Check(c.opcode == IBV_WC_SEND && c.status == IBV_WC_SUCCESS, "reply");
  (void)peer;
  Exchange(sock, 'D');
  return 0;
}

// Client side of cqex, sleeping on a completion channel of its extended CQ.
int CqexClient(int sock, Side& me, const Wire& peer) {
  for (uint32_t i = 0; i < kReplies; ++i) me.PostRecv(900 + i, kHalf + i * kSlot, kSlot);
  Exchange(sock, 'R');
  // One CQ for both queues: the server's replies may complete before the last sends do (as
  // on a real fabric), so completions are sorted by kind and each kind checked for order.
  std::vector<Cqe> sends, replies;
  auto take = [&](size_t want_sends, size_t want_replies) {
    while (sends.size() < want_sends || replies.size() < want_replies) {
      const std::vector<Cqe> got = me.Collect(1);
      if (got.empty()) return;  // Collect's time limit passed
      for (const Cqe& c : got) (c.opcode == IBV_WC_RECV ? replies : sends).push_back(c);
    }
  };
  for (uint32_t i = 0; i < kMsgs; ++i) {
    const uint32_t src = (i % 16) * 2048;  // reused once the batch of 16 completed
    std::memset(me.buf + src, static_cast<int>(i), MsgLen(i));
    if (i < kMsgs / 2)
      me.PostSend(IBV_WR_SEND_WITH_IMM, i, src, MsgLen(i), 1000 + i);
    else
      me.PostSend(IBV_WR_RDMA_WRITE_WITH_IMM, i, src, MsgLen(i), 1000 + i,
                  peer.addr + kHalf + (i - 32) * kSlot, peer.rkey);
    if (i % 16 == 15) take(i + 1, 0);  // keep the sources intact until sent
  }
  take(kMsgs, kReplies);
  Check(sends.size() == kMsgs, "all send completions arrived (event mode)");
  for (size_t k = 0; k < sends.size(); ++k)
    Check(sends[k].wr_id == k && sends[k].status == IBV_WC_SUCCESS &&
              sends[k].opcode == (k < kMsgs / 2 ? IBV_WC_SEND : IBV_WC_RDMA_WRITE),
          "send completion " + std::to_string(k) + " in order (wr_id " +
              std::to_string(sends[k].wr_id) + ", status " + std::to_string(sends[k].status) + ")");
  Check(replies.size() == kReplies, "all replies arrived (event mode)");
  for (uint32_t i = 0; i < replies.size(); ++i) {
    Check(replies[i].wr_id == 900 + i && replies[i].byte_len == 100 &&
              replies[i].status == IBV_WC_SUCCESS && (replies[i].flags & IBV_WC_WITH_IMM) == 0,
          "reply " + std::to_string(i));
    Check(me.buf[kHalf + i * kSlot] == 0x40 + static_cast<int>(i), "reply payload");
  }
  Exchange(sock, 'D');
  return 0;
}

// fork after registering: the server, at the parent's signal, writes into the parent's
// registered buffer and sends; then checks what the parent wrote into its own.
int ForkServer(int sock, Side& me, const Wire& peer) {
  me.PostRecv(1, 0, kSlot);
  std::memset(me.buf + kHalf, 0xB0, 4096);
  Check(Exchange(sock, 'R') == 'G', "the client forked and checked its child");
  me.PostSend(IBV_WR_RDMA_WRITE, 10, kHalf, 4096, 0, peer.addr, peer.rkey);
  me.PostSend(IBV_WR_SEND, 11, kHalf, 8, 0);
  const std::vector<Cqe> sent = me.Collect(2);
  Check(sent.size() == 2 && sent[0].status == IBV_WC_SUCCESS && sent[1].status == IBV_WC_SUCCESS,
        "WRITE and SEND into the parent after its fork");
  Check(Exchange(sock, 'W') == 'D', "the parent wrote back");
  bool intact = true;
  for (size_t k = 0; k < 4096; ++k) intact = intact && me.buf[8192 + k] == char(0xC1);
  Check(intact, "the parent's RDMA WRITE after the fork arrived");
  const char verdict = g_failures == 0 ? 'K' : 'F';
  WriteAll(sock, &verdict, 1);
  return 0;
}

// In the child: its own device, two QPs of its own connected to each other, one SEND.
int ChildVerbs() {
  Side a, b;
  a.Open(false);
  b.Open(false);
  const Wire wa = a.Local(), wb = b.Local();
  a.Connect(wb);
  b.Connect(wa);
  std::memset(a.buf, 0x77, 64);
  b.PostRecv(5, 0, 64);
  a.PostSend(IBV_WR_SEND, 6, 0, 64, 0);
  const std::vector<Cqe> got = b.Collect(1);
  const bool ok =
      got.size() == 1 && got[0].status == IBV_WC_SUCCESS && got[0].wr_id == 5 && b.buf[63] == 0x77;
  ibv_close_device(a.ctx);  // releases what it still holds
  ibv_close_device(b.ctx);
  return ok ? 0 : 1;
}

int ForkClient(int sock, Side& me, const Wire& peer) {
  Check(ibv_is_fork_initialized() == IBV_FORK_UNNEEDED, "ibv_is_fork_initialized: UNNEEDED");
  std::memset(me.buf, 0xA5, kBuf);
  me.PostRecv(2, kHalf, kSlot);
  const pid_t child = ::fork();
  if (child < 0) Die("fork");
  if (child == 0) {
    std::memset(me.buf, 0xEE, kBuf);  // the child's copy: must not reach the parent's memory
    const int rc = ChildVerbs();
    std::fflush(stdout);
    ::_exit(rc != 0 ? 3 : (me.buf[0] == char(0xEE) ? 0 : 4));
  }
  int status = -1;
  for (int i = 0; i < 400 && ::waitpid(child, &status, WNOHANG) == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  Check(WIFEXITED(status) && WEXITSTATUS(status) == 0,
        "the child used verbs of its own (exit " + std::to_string(status) + ")");
  bool intact = true;
  for (size_t k = 0; k < kBuf && intact; ++k) intact = me.buf[k] == char(0xA5);
  Check(intact, "the child's writes did not reach the parent's registered memory");
  Exchange(sock, 'G');
  const std::vector<Cqe> got = me.Collect(1);
  Check(got.size() == 1 && got[0].status == IBV_WC_SUCCESS && got[0].opcode == IBV_WC_RECV,
        "the parent receives after the fork");
  bool written = true;
  for (size_t k = 0; k < 4096; ++k) written = written && me.buf[k] == char(0xB0);
  Check(written, "the peer's RDMA WRITE reached the parent's registered memory after the fork");
  std::memset(me.buf + 16384, 0xC1, 4096);
  me.PostSend(IBV_WR_RDMA_WRITE, 20, 16384, 4096, 0, peer.addr + 8192, peer.rkey);
  const std::vector<Cqe> w = me.Collect(1);
  Check(w.size() == 1 && w[0].status == IBV_WC_SUCCESS, "the parent's RDMA WRITE after the fork");
  Exchange(sock, 'D');
  char verdict = 0;
  ReadAll(sock, &verdict, 1);
  Check(verdict == 'K', "the server saw the parent's write");
  return 0;
}

// ibv_query_gid_ex names the interface of this pod that holds the IPv4 address of GID 1,
// and ibv_query_gid_table returns the same entries (and refuses a buffer too small).
void CheckGidInterface(ibv_context* ctx) {
  ibv_gid_entry e{};
  Check(ibv_query_gid_ex(ctx, 1, 1, &e, 0) == 0, "ibv_query_gid_ex");
  uint32_t want = 0;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) == 0) {
    for (const ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
      if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
      const auto* sin = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
      if (std::memcmp(&sin->sin_addr, e.gid.raw + 12, 4) == 0) want = if_nametoindex(a->ifa_name);
    }
    ::freeifaddrs(list);
  }
  Check(want != 0 && e.ndev_ifindex == want, "GID 1 names the pod's interface (" +
                                                 std::to_string(e.ndev_ifindex) + " vs " +
                                                 std::to_string(want) + ")");
  Check(e.gid_type == IBV_GID_TYPE_ROCE_V2, "GID 1 is RoCE v2");
  ibv_gid_entry table[2]{};
  Check(ibv_query_gid_table(ctx, table, 2, 0) == 2 && table[1].ndev_ifindex == want,
        "ibv_query_gid_table");
  Check(ibv_query_gid_table(ctx, table, 1, 0) == -EINVAL, "a too-small GID table is EINVAL");
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  const std::string role = argc > 1 ? argv[1] : "";
  const bool server = role == "server" && argc == 4;
  if (!server && !(role == "client" && argc == 5)) {
    std::fprintf(stderr, "usage: verbs_portable server PORT MODE | client IP PORT MODE\n");
    return 2;
  }
  const std::string mode = argv[argc - 1];
  if (mode == "fork" && ibv_fork_init() != 0) Die("ibv_fork_init");
  Side me;
  me.Open(!server && mode == "cqex");
  CheckGidInterface(me.ctx);
  const int sock =
      server ? rcpair::Listen(std::atoi(argv[2])) : rcpair::Dial(argv[2], std::atoi(argv[3]));
  const Wire peer = Meet(sock, me);
  int rc = 2;
  if (mode == "cqex") rc = server ? CqexServer(sock, me, peer) : CqexClient(sock, me, peer);
  if (mode == "fork") rc = server ? ForkServer(sock, me, peer) : ForkClient(sock, me, peer);
  std::printf("%s %s: %d failure(s)\n", role.c_str(), mode.c_str(), g_failures);
  return rc != 0 ? rc : (g_failures != 0 ? 1 : 0);
}
