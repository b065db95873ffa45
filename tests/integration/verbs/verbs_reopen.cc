// A plain verbs program (the system libibverbs, run under the freeflow preload) that outlives
// its router (issue 41): two of them (server and client, meeting over TCP as perftest does)
// run SEND ping-pongs on an RC QP; the harness kills the router with SIGKILL and starts a
// new one. Each must then see IBV_EVENT_DEVICE_FATAL and its posted receive complete in
// error, destroy everything it held (every call succeeding), list the devices again until
// the new router's device is there, open it and run the ping-pong again in the same
// process. It prints how long it was without a device. What the lost session leaves open
// is checked too: a QP destroyed before the loss leaves a spare segment, which must go with
// the lost session, and no session keeps its request ring's memfd (the router has it).
//
//   verbs_reopen server PORT
//   verbs_reopen client SERVER_IP PORT
// Exit status: 0 as expected, 1 another outcome, 2 a call that failed outright.
#include <infiniband/verbs.h>
#include <poll.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "proc_fds.h"
#include "rc_pair.h"

namespace {

using rcpair::Die;
using rcpair::ReadAll;
using rcpair::WriteAll;
using Clock = std::chrono::steady_clock;

constexpr uint32_t kMsg = 64;
constexpr int kRoundTrips = 1000;
constexpr double kFatalBoundS = 20;   // the router's death seen as DEVICE_FATAL within
constexpr double kReopenBoundS = 60;  // the new router's device found within

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct Wire {
  uint32_t qpn;
  uint32_t index;  // the sender's device index (informational)
  uint8_t gid[16];
};

// One device's worth of objects: an RC QP, its CQ and a registered buffer.
struct Device {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
  ibv_mr* mr = nullptr;
  char buf[2 * kMsg] = {};  // [0, kMsg): receives, [kMsg, 2 kMsg): sends
  int index = -1;

  // Opens the first device listed; false when none is listed.
  bool Open() {
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    if (list == nullptr || n == 0) {
      if (list != nullptr) ibv_free_device_list(list);
      return false;
    }
    index = ibv_get_device_index(list[0]);
    ctx = ibv_open_device(list[0]);
    ibv_free_device_list(list);
    if (ctx == nullptr) Die("open device");
    pd = ibv_alloc_pd(ctx);
    cq = pd != nullptr ? ibv_create_cq(ctx, 64, nullptr, nullptr, 0) : nullptr;
    mr = cq != nullptr ? ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE) : nullptr;
    if (mr == nullptr) Die("PD, CQ or MR");
    qp = rcpair::NewRcQp(pd, cq, cq, 16, 0);
    return true;
  }

  // Meets the peer over `sock` and brings the QP to RTS.
  void Connect(int sock) {
    ibv_gid gid{};
    if (ibv_query_gid(ctx, 1, 1, &gid) != 0) Die("query gid");
    Wire mine{qp->qp_num, static_cast<uint32_t>(index), {}}, peer{};
    std::memcpy(mine.gid, gid.raw, 16);
    WriteAll(sock, &mine, sizeof(mine));
    ReadAll(sock, &peer, sizeof(peer));
    rcpair::ToRts(qp, peer.qpn, peer.gid, 7, 1);
  }

  void PostRecv() {
    ibv_sge sge{reinterpret_cast<uintptr_t>(buf), kMsg, mr->lkey};
    ibv_recv_wr wr{};
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    if (ibv_post_recv(qp, &wr, &bad) != 0) Die("post_recv");
  }

  void PostSend(uint32_t seq) {
    std::memcpy(buf + kMsg, &seq, sizeof(seq));
    ibv_sge sge{reinterpret_cast<uintptr_t>(buf + kMsg), kMsg, mr->lkey};
    ibv_send_wr wr{};
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr* bad = nullptr;
    if (ibv_post_send(qp, &wr, &bad) != 0) Die("post_send");
  }

  // The next completion within `bound_s` (status -1: none came).
  ibv_wc Next(double bound_s) {
    const auto t0 = Clock::now();
    ibv_wc wc{};
    wc.status = static_cast<ibv_wc_status>(-1);
    while (SecondsSince(t0) < bound_s) {
      const int n = ibv_poll_cq(cq, 1, &wc);
      if (n < 0) Die("poll_cq");
      if (n == 1) return wc;
    }
    wc.status = static_cast<ibv_wc_status>(-1);
    return wc;
  }

  // kRoundTrips SENDs each way, each carrying its number, checked on arrival. The client
  // starts each round trip; the server answers. A receive is always posted ahead of the
  // peer's next SEND (one before the exchange, one right after each arrival).
  bool PingPong(int sock, bool client) {
    PostRecv();
    char go = 'g';
    if (client) {
      ReadAll(sock, &go, 1);  // the server's receive is posted
    } else {
      WriteAll(sock, &go, 1);
    }
    for (uint32_t i = 0; i < kRoundTrips; ++i) {
      if (client) PostSend(i);
      int sends = client ? 1 : 0;
      bool received = false;
      while (!received || sends > 0) {
        const ibv_wc wc = Next(5.0);
        if (wc.status != IBV_WC_SUCCESS) {
          std::printf("FAIL round trip %u: completion status %d\n", i, static_cast<int>(wc.status));
          return false;
        }
        if (wc.opcode == IBV_WC_SEND) {
          --sends;
          continue;
        }
        uint32_t got = 0;
        std::memcpy(&got, buf, sizeof(got));
        if (got != i) {
          std::printf("FAIL round trip %u: message %u arrived\n", i, got);
          return false;
        }
        received = true;
        PostRecv();
        if (!client) {
          PostSend(i);
          ++sends;
        }
      }
    }
    return true;
  }

  // Destroys everything; false when a destroy did not succeed.
  bool Close() {
    bool ok = ibv_destroy_qp(qp) == 0;
    ok = ibv_dereg_mr(mr) == 0 && ok;
    ok = ibv_destroy_cq(cq) == 0 && ok;
    ok = ibv_dealloc_pd(pd) == 0 && ok;
    ok = ibv_close_device(ctx) == 0 && ok;
    *this = Device{};
    return ok;
  }
};

// Waits for IBV_EVENT_DEVICE_FATAL on `ctx` (other events are acknowledged and passed).
bool AwaitDeviceFatal(ibv_context* ctx, double bound_s) {
  const auto t0 = Clock::now();
  while (SecondsSince(t0) < bound_s) {
    pollfd p{ctx->async_fd, POLLIN, 0};
    if (::poll(&p, 1, 100) != 1) continue;
    ibv_async_event e{};
    if (ibv_get_async_event(ctx, &e) != 0) Die("get_async_event");
    const ibv_event_type type = e.event_type;
    ibv_ack_async_event(&e);
    if (type == IBV_EVENT_DEVICE_FATAL) return true;
  }
  return false;
}

int Run(int sock, bool client) {
  Device d;
  if (!d.Open()) Die("no RDMA device");
  d.Connect(sock);
  if (!d.PingPong(sock, client)) return 1;
  // A QP that never met a peer, destroyed: the library keeps its segment for a next QP.
  ibv_qp* spare = rcpair::NewRcQp(d.pd, d.cq, d.cq, 16, 0);
  if (ibv_destroy_qp(spare) != 0) Die("destroy the spare QP");
  std::printf("QP segments open before the loss: %d\n",
              fftest::DescriptorsNamed("/memfd:ffverbs-qp"));
  std::printf("READY %d round trips on device index %d\n", kRoundTrips, d.index);
  std::fflush(stdout);

  // The harness kills the router now.
  d.PostRecv();
  const auto t0 = Clock::now();
  if (!AwaitDeviceFatal(d.ctx, kFatalBoundS)) {
    std::printf("FAIL no IBV_EVENT_DEVICE_FATAL within %.0f s\n", kFatalBoundS);
    return 1;
  }
  const double fatal_s = SecondsSince(t0);
  const ibv_wc wc = d.Next(5.0);
  if (static_cast<int>(wc.status) < 0 || wc.status == IBV_WC_SUCCESS) {
    std::printf("FAIL the posted receive did not complete in error (status %d)\n",
                static_cast<int>(wc.status));
    return 1;
  }
  std::printf("DEVICE_FATAL %.3f s after READY; the posted receive: %s\n", fatal_s,
              ibv_wc_status_str(wc.status));
  if (!d.Close()) {
    std::printf("FAIL destroying the lost device's objects\n");
    return 1;
  }

  // The same process, the new router.
  const auto t1 = Clock::now();
  while (!d.Open()) {
    if (SecondsSince(t1) > kReopenBoundS) {
      std::printf("FAIL no device within %.0f s of DEVICE_FATAL\n", kReopenBoundS);
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const double reopen_s = SecondsSince(t1);
  // Open made one QP; nothing of the lost session's is left open.
  const int segments = fftest::DescriptorsNamed("/memfd:ffverbs-qp");
  const int rings = fftest::DescriptorsNamed("/memfd:ffverbs-requests");
  if (segments != 1 || rings != 0) {
    std::printf(
        "FAIL open after the reopen: %d QP segments (want the new QP's 1), %d request "
        "rings (want 0)\n",
        segments, rings);
    return 1;
  }
  d.Connect(sock);
  if (!d.PingPong(sock, client)) return 1;
  std::printf("PASS reopened device index %d %.3f s after DEVICE_FATAL; %d round trips again\n",
              d.index, reopen_s, kRoundTrips);
  return d.Close() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "server" && argc == 3) return Run(rcpair::Listen(std::atoi(argv[2])), false);
  if (mode == "client" && argc == 4) return Run(rcpair::Dial(argv[2], std::atoi(argv[3])), true);
  std::fprintf(stderr, "usage: verbs_reopen server PORT | client SERVER_IP PORT\n");
  return 2;
}
