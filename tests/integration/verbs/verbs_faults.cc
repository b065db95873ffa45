// A small, ordinary verbs program (linked against the system libibverbs, run under the
// freeflow preload) that checks the error semantics a verbs programmer relies on:
// access violations, deregistration, RNR, and what happens when the peer, the router or
// a hostile client misbehaves. Server and client meet over TCP like perftest does.
//
//   verbs_faults server PORT
//   verbs_faults client SERVER_IP PORT TEST     TEST: access | dereg | rnr | peer_gone | flood |
//                                               intact
//   verbs_faults hostile SOCKET_PATH
//   verbs_faults hold                            (creates resources, prints READY, sleeps)
//   verbs_faults refused                         (router: --max-qps-per-pod 18)
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
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
constexpr uint8_t kPattern = 0x5a;

struct Wire {
  uint32_t qpn;
  uint32_t rkey_a;
  uint32_t rkey_b;
  uint32_t reserved;
  uint64_t addr_a;
  uint64_t addr_b;
  uint8_t gid[16];
};

using rcpair::Dial;
using rcpair::Die;
using rcpair::Listen;
using rcpair::ReadAll;
using rcpair::WriteAll;

struct Verbs {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
  ibv_mr* mr_a = nullptr;  // remote read/write/atomic
  ibv_mr* mr_b = nullptr;  // local write only
  char* a = nullptr;
  char* b = nullptr;
  ibv_gid gid{};

  void Open() {
    ctx = rcpair::OpenFirstDevice();
    pd = ibv_alloc_pd(ctx);
    cq = ibv_create_cq(ctx, 256, nullptr, nullptr, 0);
    a = static_cast<char*>(aligned_alloc(4096, kBuf));
    b = static_cast<char*>(aligned_alloc(4096, kBuf));
    std::memset(a, kPattern, kBuf);
    std::memset(b, kPattern, kBuf);
    mr_a = ibv_reg_mr(pd, a, kBuf,
                      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                          IBV_ACCESS_REMOTE_ATOMIC);
    mr_b = ibv_reg_mr(pd, b, kBuf, IBV_ACCESS_LOCAL_WRITE);
    if (pd == nullptr || cq == nullptr || mr_a == nullptr || mr_b == nullptr) Die("resources");
    qp = rcpair::NewRcQp(
        pd, cq, cq, 64,
        IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
    if (ibv_query_gid(ctx, 1, 1, &gid) != 0) Die("query gid");
  }

  Wire Local() const {
    Wire w{};
    w.qpn = qp->qp_num;
    w.rkey_a = mr_a->rkey;
    w.rkey_b = mr_b->rkey;
    w.addr_a = reinterpret_cast<uintptr_t>(a);
    w.addr_b = reinterpret_cast<uintptr_t>(b);
    std::memcpy(w.gid, gid.raw, 16);
    return w;
  }

  void Connect(const Wire& peer, uint8_t rnr_retry) {
    rcpair::ToRts(qp, peer.qpn, peer.gid, rnr_retry, 4);
  }

  // Posts one signaled WR and waits (bounded) for its completion.
  ibv_wc_status Post(ibv_wr_opcode op, uint32_t rkey, uint64_t raddr, uint32_t len,
                     double timeout_s = 5.0) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(b), len, mr_b->lkey};
    ibv_send_wr wr{};
    wr.wr_id = 7;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = op;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = raddr;
    wr.wr.rdma.rkey = rkey;
    ibv_send_wr* bad = nullptr;
    if (ibv_post_send(qp, &wr, &bad) != 0) Die("post_send");
    return Wait(timeout_s);
  }

  ibv_wc_status Wait(double timeout_s) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    ibv_wc wc{};
    while (std::chrono::steady_clock::now() < end) {
      const int n = ibv_poll_cq(cq, 1, &wc);
      if (n < 0) Die("poll_cq");
      if (n == 1) return wc.status;
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    return static_cast<ibv_wc_status>(-1);
  }
};

bool Untouched(const char* p, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (static_cast<uint8_t>(p[i]) != kPattern) return false;
  return true;
}

// Server: answers one-byte commands. 'c' = are buffers untouched? 'd' = dereg A,
// 'p' = post nothing, 'q' = quit.
int Server(int port) {
  Verbs v;
  v.Open();
  const int sock = Listen(port);
  Wire mine = v.Local(), peer{};
  WriteAll(sock, &mine, sizeof(mine));
  ReadAll(sock, &peer, sizeof(peer));
  v.Connect(peer, 7);
  for (;;) {
    char cmd;
    ReadAll(sock, &cmd, 1);
    char reply = 1;
    if (cmd == 'c') {
      reply = Untouched(v.a, kBuf) && Untouched(v.b, kBuf) ? 1 : 0;
    } else if (cmd == 'e') {  // is the completion queue empty?
      ibv_wc wc{};
      reply = ibv_poll_cq(v.cq, 1, &wc) == 0 ? 1 : 0;
    } else if (cmd == 'w') {  // did the last legal write land?
      reply = v.a[100] == 0x11 ? 1 : 0;
    } else if (cmd == 'r') {  // restore the pattern
      std::memset(v.a, kPattern, kBuf);
    } else if (cmd == 'd') {
      reply = ibv_dereg_mr(v.mr_a) == 0 ? 1 : 0;
    } else if (cmd == 'q') {
      WriteAll(sock, &reply, 1);
      return 0;
    }
    WriteAll(sock, &reply, 1);
  }
}

char Ask(int sock, char cmd) {
  char r = 0;
  WriteAll(sock, &cmd, 1);
  ReadAll(sock, &r, 1);
  return r;
}

int Fail(const char* what, ibv_wc_status got) {
  std::fprintf(stderr, "FAIL %s (completion status %d: %s)\n", what, static_cast<int>(got),
               static_cast<int>(got) >= 0 ? ibv_wc_status_str(got) : "timeout");
  return 1;
}

// The server posts no receive and its QP retries RNR forever: post 64 SENDs of 1 MiB (far
// more than a channel's window) and hold them for $FF_FLOOD_SECONDS (default 15) while the
// harness measures other traffic between the same nodes. None may complete: not in error
// (the link that carries them must stay up), and not successfully (nothing was received).
int Flood(Verbs& v) {
  constexpr size_t kMessage = 1 << 20;
  char* big = static_cast<char*>(aligned_alloc(4096, kMessage));
  std::memset(big, kPattern, kMessage);
  ibv_mr* mr = ibv_reg_mr(v.pd, big, kMessage, IBV_ACCESS_LOCAL_WRITE);
  if (mr == nullptr) Die("reg flood buffer");
  int posted = 0;
  for (; posted < 64; ++posted) {
    ibv_sge sge{reinterpret_cast<uintptr_t>(big), kMessage, mr->lkey};
    ibv_send_wr wr{};
    wr.wr_id = static_cast<uint64_t>(posted);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr* bad = nullptr;
    if (ibv_post_send(v.qp, &wr, &bad) != 0) break;
  }
  const char* env = std::getenv("FF_FLOOD_SECONDS");
  const double seconds = env != nullptr ? std::atof(env) : 15.0;
  std::printf("FLOODING %d SENDs of 1 MiB\n", posted);
  std::fflush(stdout);
  // Looks every 10 ms, not spinning: the CPU belongs to the traffic being measured.
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  ibv_wc wc{};
  int got = 0;
  while (got == 0 && std::chrono::steady_clock::now() < end) {
    got = ibv_poll_cq(v.cq, 1, &wc);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const bool held = got == 0;
  std::printf("%s flood: %d SENDs held for %.0f s%s\n", held ? "PASS" : "FAIL", posted, seconds,
              held ? "" : " (a completion came)");
  return held && posted >= 16 ? 0 : 1;
}

int Client(const char* ip, int port, const std::string& test) {
  Verbs v;
  v.Open();
  const int sock = Dial(ip, port);
  Wire mine = v.Local(), peer{};
  ReadAll(sock, &peer, sizeof(peer));
  WriteAll(sock, &mine, sizeof(mine));
  v.Connect(peer, test == "rnr" ? 2 : 7);
  int failures = 0;
  ibv_wc_status st;
  if (test == "access") {
    st = v.Post(IBV_WR_RDMA_WRITE, peer.rkey_a ^ 0x5500, peer.addr_a, 64);
    if (st != IBV_WC_REM_ACCESS_ERR) failures += Fail("forged rkey must give REM_ACCESS_ERR", st);
    if (!Ask(sock, 'c')) failures += Fail("forged-rkey write touched memory", st);
    // The QP is now in error: further work is flushed.
    st = v.Post(IBV_WR_RDMA_WRITE, peer.rkey_a, peer.addr_a, 64);
    if (st != IBV_WC_WR_FLUSH_ERR) failures += Fail("a QP in error must flush", st);
    std::puts(failures == 0 ? "PASS forged rkey" : "FAIL forged rkey");
  } else if (test == "oob") {
    st = v.Post(IBV_WR_RDMA_WRITE, peer.rkey_a, peer.addr_a + kBuf - 8, 64);
    if (st != IBV_WC_REM_ACCESS_ERR) failures += Fail("out-of-bounds write", st);
    if (!Ask(sock, 'c')) failures += Fail("out-of-bounds write touched memory", st);
    std::puts(failures == 0 ? "PASS out-of-bounds write" : "FAIL out-of-bounds write");
  } else if (test == "noaccess") {
    st = v.Post(IBV_WR_RDMA_WRITE, peer.rkey_b, peer.addr_b, 64);
    if (st != IBV_WC_REM_ACCESS_ERR) failures += Fail("write to MR without REMOTE_WRITE", st);
    if (!Ask(sock, 'c')) failures += Fail("write without access touched memory", st);
    std::puts(failures == 0 ? "PASS missing access flag" : "FAIL missing access flag");
  } else if (test == "dereg") {
    std::memset(v.b, 0x11, 256);
    st = v.Post(IBV_WR_RDMA_WRITE, peer.rkey_a, peer.addr_a, 256);
    if (st != IBV_WC_SUCCESS || !Ask(sock, 'w')) failures += Fail("legal write", st);
    Ask(sock, 'r');
    if (!Ask(sock, 'd')) failures += Fail("server dereg", st);
    st = v.Post(IBV_WR_RDMA_WRITE, peer.rkey_a, peer.addr_a, 256);
    if (st != IBV_WC_REM_ACCESS_ERR) failures += Fail("write with a deregistered rkey", st);
    if (!Ask(sock, 'c')) failures += Fail("write after dereg touched memory", st);
    std::puts(failures == 0 ? "PASS dereg revokes" : "FAIL dereg revokes");
  } else if (test == "rnr") {
    // The server posted no receive: with rnr_retry=2 the SEND must fail, not hang.
    const auto t0 = std::chrono::steady_clock::now();
    st = v.Post(IBV_WR_SEND, 0, 0, 16, 10.0);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (st != IBV_WC_RNR_RETRY_EXC_ERR) failures += Fail("SEND without receive", st);
    std::printf("%s RNR retry exceeded after %.3f s\n", failures == 0 ? "PASS" : "FAIL", s);
  } else if (test == "intact") {
    // Tells the harness what an attacker would aim at, waits for a byte on stdin (the
    // attacks are over), then checks the server's memory and completion queue.
    std::printf("VICTIM %u %u %llu %u\n", peer.qpn, peer.rkey_a,
                static_cast<unsigned long long>(peer.addr_a), mine.qpn);
    std::fflush(stdout);
    char go;
    if (::read(0, &go, 1) != 1) Die("stdin");
    const bool memory = Ask(sock, 'c') != 0, cq = Ask(sock, 'e') != 0;
    if (!memory) failures += Fail("the server's memory changed", IBV_WC_SUCCESS);
    if (!cq) failures += Fail("the server got a completion", IBV_WC_SUCCESS);
    std::puts(failures == 0 ? "PASS the server's memory and CQ are untouched"
                            : "FAIL the server was touched");
  } else if (test == "flood") {
    failures += Flood(v);
  } else if (test == "peer_gone") {
    // Post a receive and wait: the harness kills the server (or the router). The
    // receive must complete in error within the bound, not hang.
    ibv_sge sge{reinterpret_cast<uintptr_t>(v.b), 64, v.mr_b->lkey};
    ibv_recv_wr wr{};
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    if (ibv_post_recv(v.qp, &wr, &bad) != 0) Die("post_recv");
    std::puts("READY");
    std::fflush(stdout);
    const auto t0 = std::chrono::steady_clock::now();
    st = v.Wait(10.0);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (static_cast<int>(st) < 0 || st == IBV_WC_SUCCESS) failures += Fail("peer gone", st);
    // A send after that fails too.
    const ibv_wc_status st2 = v.Post(IBV_WR_SEND, 0, 0, 16, 10.0);
    if (static_cast<int>(st2) < 0 || st2 == IBV_WC_SUCCESS)
      failures += Fail("send to gone peer", st2);
    std::printf("%s error completion %.3f s after READY (%s, then %s)\n",
                failures == 0 ? "PASS" : "FAIL", s,
                static_cast<int>(st) >= 0 ? ibv_wc_status_str(st) : "timeout",
                static_cast<int>(st2) >= 0 ? ibv_wc_status_str(st2) : "timeout");
    return failures == 0 ? 0 : 1;
  }
  Ask(sock, 'q');
  return failures == 0 ? 0 : 1;
}

// Sends malformed and hostile messages to the router socket. Exit 0 when the router
// disconnected us after each one (and did not crash).
int Hostile(const char* path) {
  struct Case {
    const char* name;
    std::vector<char> bytes;
  };
  std::vector<Case> cases;
  cases.push_back({"empty datagram", {}});
  cases.push_back({"short header", {1, 0}});
  cases.push_back({"unknown op", std::vector<char>(64, 0x7f)});
  std::vector<char> before_hello(16, 0);
  before_hello[0] = 8;  // CreateQp before Hello
  cases.push_back({"request before HELLO", before_hello});
  std::vector<char> big_hello(200, 0);
  big_hello[0] = 1;
  cases.push_back({"HELLO of the wrong size", big_hello});
  std::vector<char> hello(16, 0);
  hello[0] = 1;
  cases.push_back({"HELLO without descriptors", hello});
  int failures = 0;
  for (const Case& c : cases) {
    const int s = ::socket(AF_UNIX, SOCK_SEQPACKET, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
    if (::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) Die("connect router");
    ::send(s, c.bytes.data(), c.bytes.size(), MSG_NOSIGNAL);
    timeval tv{5, 0};
    ::setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    char buf[256];
    const ssize_t n = ::recv(s, buf, sizeof(buf), 0);
    const bool dropped = n == 0 || (n < 0 && errno == ECONNRESET);
    std::printf("%s hostile %s: %s\n", dropped ? "PASS" : "FAIL", c.name,
                dropped ? "disconnected" : "still connected");
    failures += dropped ? 0 : 1;
    ::close(s);
  }
  return failures == 0 ? 0 : 1;
}

// Overlapping and unaligned registrations of one process, exercised through a QP
// connected to itself: the regions behind them are merged and keys stay valid.
int Overlap() {
  Verbs v;
  v.Open();
  char* big = static_cast<char*>(aligned_alloc(4096, 6 * 4096));
  std::memset(big, 0, 6 * 4096);
  ibv_mr* first =
      ibv_reg_mr(v.pd, big + 100, 4096,
                 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  ibv_mr* second = ibv_reg_mr(v.pd, big + 3 * 4096 + 7, 2 * 4096,
                              IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  // Bridges the two: the library must merge all three into one region.
  ibv_mr* bridge = ibv_reg_mr(v.pd, big + 2 * 4096, 2 * 4096, IBV_ACCESS_LOCAL_WRITE);
  if (first == nullptr || second == nullptr || bridge == nullptr) Die("overlapping reg_mr");
  v.Connect(v.Local(), 7);
  int failures = 0;
  std::memset(v.b, 0x22, 64);
  ibv_wc_status st =
      v.Post(IBV_WR_RDMA_WRITE, second->rkey, reinterpret_cast<uintptr_t>(big + 3 * 4096 + 7), 64);
  if (st != IBV_WC_SUCCESS || big[3 * 4096 + 7] != 0x22)
    failures += Fail("write into merged region", st);
  std::memset(v.b, 0x33, 64);
  st = v.Post(IBV_WR_RDMA_WRITE, first->rkey, reinterpret_cast<uintptr_t>(big + 100), 64);
  if (st != IBV_WC_SUCCESS || big[100] != 0x33) failures += Fail("write into first region", st);
  big[200] = 0x44;  // the application's own stores stay visible through the mapping
  st = v.Post(IBV_WR_RDMA_READ, first->rkey, reinterpret_cast<uintptr_t>(big + 200), 8);
  if (st != IBV_WC_SUCCESS || v.b[0] != 0x44) failures += Fail("read after merge", st);
  ibv_dereg_mr(bridge);
  ibv_dereg_mr(second);
  ibv_dereg_mr(first);
  if (big[100] != 0x33 || big[3 * 4096 + 7] != 0x22)
    failures += Fail("contents kept after dereg", st);
  std::puts(failures == 0 ? "PASS overlapping registrations" : "FAIL overlapping registrations");
  return failures == 0 ? 0 : 1;
}

int Hold() {
  Verbs v;
  v.Open();
  std::puts("READY");
  std::fflush(stdout);
  for (int i = 0; i < 600; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  return 0;
}

ibv_qp* TryRcQp(ibv_pd* pd, ibv_cq* cq) {
  ibv_qp_init_attr init{};
  init.send_cq = cq;
  init.recv_cq = cq;
  init.qp_type = IBV_QPT_RC;
  init.cap = {16, 16, 1, 1, 0};
  return ibv_create_qp(pd, &init);
}

// Waits (bounded) for one async event of `ctx`, polling `cq` meanwhile as a program that
// waits for completions would.
bool NextAsyncEvent(ibv_context* ctx, ibv_cq* cq, ibv_async_event* ev) {
  for (int i = 0; i < 300; ++i) {
    ibv_wc wc{};
    ibv_poll_cq(cq, 1, &wc);
    pollfd p{ctx->async_fd, POLLIN, 0};
    if (::poll(&p, 1, 10) == 1) return ibv_get_async_event(ctx, ev) == 0;
  }
  return false;
}

// A QP created under a number the router granted (posted, not waited for) that the router
// then refuses: another process of the pod took the pod's last QPs in between (the router
// runs with --max-qps-per-pod 18). The program's QP fails, IBV_EVENT_QP_FATAL and state
// ERR, and after a reset it cannot be brought up again: no QP that silently does not exist.
int Refused() {
  ibv_context* ctx = rcpair::OpenFirstDevice();
  ibv_pd* pd = ibv_alloc_pd(ctx);
  ibv_cq* cq = ibv_create_cq(ctx, 64, nullptr, nullptr, 0);
  if (pd == nullptr || cq == nullptr || TryRcQp(pd, cq) == nullptr) Die("resources");
  int ready[2], done[2];
  if (::pipe(ready) != 0 || ::pipe(done) != 0) Die("pipe");
  const pid_t child = ::fork();
  if (child < 0) Die("fork");
  if (child == 0) {  // another process of the pod, with a session of its own
    ::alarm(30);
    ::close(ready[0]);
    ::close(done[1]);
    ibv_context* c = rcpair::OpenFirstDevice();
    ibv_pd* cpd = ibv_alloc_pd(c);
    ibv_cq* ccq = ibv_create_cq(c, 64, nullptr, nullptr, 0);
    int made = 0;
    while (made < 100 && cpd != nullptr && ccq != nullptr && TryRcQp(cpd, ccq) != nullptr) ++made;
    std::printf("another process of the pod took %d QPs\n", made);
    std::fflush(stdout);
    char b = 1;
    if (::write(ready[1], &b, 1) != 1) ::_exit(1);
    ::read(done[0], &b, 1);  // holds its QPs until the parent is done
    ::_exit(0);
  }
  char b = 0;
  pollfd p{ready[0], POLLIN, 0};
  if (::poll(&p, 1, 20000) != 1 || ::read(ready[0], &b, 1) != 1) Die("the other process");
  ibv_qp* qp = TryRcQp(pd, cq);
  int rc = 1;
  ibv_async_event ev{};
  if (qp == nullptr) {
    std::puts("FAIL: the create was answered (no granted number was used)");
  } else if (!NextAsyncEvent(ctx, cq, &ev)) {
    std::puts("FAIL: no async event for the refused QP within 3 s");
  } else {
    ibv_qp_attr attr{};
    ibv_qp_init_attr init{};
    const bool fatal = ev.event_type == IBV_EVENT_QP_FATAL && ev.element.qp == qp;
    ibv_ack_async_event(&ev);
    const bool err =
        ibv_query_qp(qp, &attr, IBV_QP_STATE, &init) == 0 && attr.qp_state == IBV_QPS_ERR;
    attr.qp_state = IBV_QPS_RESET;
    const bool reset = ibv_modify_qp(qp, &attr, IBV_QP_STATE) == 0;
    attr = ibv_qp_attr{};
    attr.qp_state = IBV_QPS_INIT;
    attr.port_num = 1;
    const int init_rc = ibv_modify_qp(
        qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
    std::printf("refused QP: QP_FATAL %s, state ERR %s, reset %s, then INIT: %s\n",
                fatal ? "yes" : "no", err ? "yes" : "no", reset ? "yes" : "no",
                std::strerror(init_rc));
    rc = fatal && err && reset && init_rc != 0 ? 0 : 1;
  }
  ::close(done[1]);
  int st = 0;
  ::waitpid(child, &st, 0);
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "server" && argc == 3) return Server(std::atoi(argv[2]));
  if (mode == "client" && argc == 5) return Client(argv[2], std::atoi(argv[3]), argv[4]);
  if (mode == "hostile" && argc == 3) return Hostile(argv[2]);
  if (mode == "hold") return Hold();
  if (mode == "overlap") return Overlap();
  if (mode == "refused") return Refused();
  std::fprintf(stderr,
               "usage: verbs_faults server PORT | client IP PORT TEST | hostile SOCK | hold\n");
  return 2;
}
