// ffadversary_srq: the victim of issue 37's attack 5 and its RC clients, ordinary pods that
// use the real library (run them under LD_PRELOAD=libffverbs.so).
//   ffadversary_srq serve DIR    an SRQ that a UD QP and one RC QP per client share. It
//       describes itself in DIR/srq-victim ("<ip> 0 <UD QPN>", as victim.h's file), then
//       serves clients until DIR/srq-victim.release appears (at most 10 minutes): for each
//       DIR/srq-client-<k> ("<ip> <QPN>", k = 1, 2, ...) it connects a new RC QP on the SRQ
//       to that QP and answers in DIR/srq-ready-<k> with its number. Every receive it takes
//       it posts again. It exits 0 when no completion failed and the device never reported
//       a fatal error, and prints what it received.
//   ffadversary_srq send DIR K N  client k: connects an RC QP to the victim's RC QP for it
//       and sends N SENDs, each of which must complete successfully within 10 s (RNR
//       retried without end, as ibv_rc_pingpong does: receives that never come show as the
//       bound, not as an error status). Exits 0 when all did.
// A third pod that resolves the UD QP cannot reach the SRQ's credits (the attack,
// tests/adversary/srq_share.cc), so the RC clients' SENDs keep finding receives.
#include <infiniband/verbs.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "victim_verbs.h"

namespace {

using ff::adversary::FatalEvents;
using ff::adversary::NewQp;
using ff::adversary::UdToRts;

using Clock = std::chrono::steady_clock;

constexpr uint32_t kSrqDepth = 64;
constexpr uint32_t kSlot = 256;
constexpr auto kServeFor = std::chrono::minutes(10);
constexpr auto kCompletionBound = std::chrono::seconds(10);
constexpr auto kMeetBound = std::chrono::seconds(20);

struct Device {
  ibv_device** list = nullptr;
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  std::vector<char> buf;
  ibv_mr* mr = nullptr;
  uint32_t ip = 0;  // host order
};

bool Open(Device* d, size_t bytes) {
  int n = 0;
  d->list = ibv_get_device_list(&n);
  d->ctx = d->list != nullptr && n > 0 ? ibv_open_device(d->list[0]) : nullptr;
  d->pd = d->ctx != nullptr ? ibv_alloc_pd(d->ctx) : nullptr;
  d->cq = d->pd != nullptr ? ibv_create_cq(d->ctx, 256, nullptr, nullptr, 0) : nullptr;
  d->buf.assign(bytes, 0);
  d->mr =
      d->cq != nullptr ? ibv_reg_mr(d->pd, d->buf.data(), bytes, IBV_ACCESS_LOCAL_WRITE) : nullptr;
  ibv_gid gid{};
  if (d->mr == nullptr || ibv_query_gid(d->ctx, 1, 1, &gid) != 0) return false;
  d->ip = static_cast<uint32_t>(gid.raw[12]) << 24 | static_cast<uint32_t>(gid.raw[13]) << 16 |
          static_cast<uint32_t>(gid.raw[14]) << 8 | gid.raw[15];
  return true;
}

std::string IpText(uint32_t ip) {
  return std::to_string(ip >> 24) + "." + std::to_string(ip >> 16 & 255) + "." +
         std::to_string(ip >> 8 & 255) + "." + std::to_string(ip & 255);
}

bool ParseIp(const std::string& text, uint32_t* ip) {
  unsigned a, b, c, d;
  if (std::sscanf(text.c_str(), "%u.%u.%u.%u", &a, &b, &c, &d) != 4 || a > 255 || b > 255 ||
      c > 255 || d > 255)
    return false;
  *ip = a << 24 | b << 16 | c << 8 | d;
  return true;
}

// Written whole: a temporary name, then rename.
void Put(const std::string& path, const std::string& value) {
  {
    std::ofstream out(path + ".tmp");
    out << value << "\n";
  }
  std::rename((path + ".tmp").c_str(), path.c_str());
}

bool Get(const std::string& path, std::string* value) {
  std::ifstream in(path);
  if (!in) return false;
  std::getline(in, *value);
  return true;
}

bool WaitFor(const std::string& path, std::string* value) {
  const auto end = Clock::now() + kMeetBound;
  while (Clock::now() < end) {
    if (Get(path, value)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// An RC QP from RESET to RTS, connected to QP `qpn` at `ip`.
bool RcToRts(ibv_qp* qp, uint32_t ip, uint32_t qpn) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
    return false;
  a = {};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = qpn;
  a.rq_psn = 0;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.is_global = 1;
  a.ah_attr.port_num = 1;
  a.ah_attr.grh.sgid_index = 1;
  a.ah_attr.grh.hop_limit = 1;
  uint8_t* gid = a.ah_attr.grh.dgid.raw;
  gid[10] = gid[11] = 0xff;
  gid[12] = static_cast<uint8_t>(ip >> 24);
  gid[13] = static_cast<uint8_t>(ip >> 16);
  gid[14] = static_cast<uint8_t>(ip >> 8);
  gid[15] = static_cast<uint8_t>(ip);
  if (ibv_modify_qp(qp, &a,
                    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                        IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
    return false;
  a = {};
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.sq_psn = 0;
  a.max_rd_atomic = 1;
  return ibv_modify_qp(qp, &a,
                       IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                           IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) == 0;
}

bool PostSrqRecv(const Device& d, ibv_srq* srq, uint32_t slot) {
  ibv_sge sge{reinterpret_cast<uintptr_t>(d.buf.data() + slot * kSlot), kSlot, d.mr->lkey};
  ibv_recv_wr wr{};
  wr.wr_id = slot;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  return ibv_post_srq_recv(srq, &wr, &bad) == 0;
}

int Serve(const std::string& dir) {
  Device d;
  ibv_srq_init_attr sa{};
  sa.attr.max_wr = kSrqDepth;
  sa.attr.max_sge = 1;
  ibv_srq* srq = Open(&d, kSrqDepth * kSlot) ? ibv_create_srq(d.pd, &sa) : nullptr;
  ibv_qp* ud = srq != nullptr ? NewQp(d.pd, d.cq, IBV_QPT_UD, srq) : nullptr;
  bool ok = ud != nullptr && UdToRts(ud);
  for (uint32_t slot = 0; ok && slot < kSrqDepth; ++slot) ok = PostSrqRecv(d, srq, slot);
  if (!ok) {
    std::fprintf(stderr, "srq victim: could not set up its device, SRQ and UD QP\n");
    return 2;
  }
  Put(dir + "/srq-victim", IpText(d.ip) + " 0 " + std::to_string(ud->qp_num));
  std::printf("srq victim %s: UD QP %#x on an SRQ of %u receives\n", IpText(d.ip).c_str(),
              ud->qp_num, kSrqDepth);
  std::fflush(stdout);
  std::vector<ibv_qp*> rcs;
  uint64_t on_rc = 0, on_ud = 0, failed = 0;
  const std::string release = dir + "/srq-victim.release";
  const auto end = Clock::now() + kServeFor;
  auto looked = Clock::now();
  while (Clock::now() < end) {
    ibv_wc wc[16];
    const int n = ibv_poll_cq(d.cq, 16, wc);
    for (int i = 0; i < n; ++i) {
      if (wc[i].status != IBV_WC_SUCCESS) {
        ++failed;
        std::printf("srq victim: a completion failed on QP %#x: %s\n", wc[i].qp_num,
                    ibv_wc_status_str(wc[i].status));
      } else if (wc[i].opcode & IBV_WC_RECV) {
        ++(wc[i].qp_num == ud->qp_num ? on_ud : on_rc);
      }
      if ((wc[i].opcode & IBV_WC_RECV) && wc[i].wr_id < kSrqDepth &&
          !PostSrqRecv(d, srq, static_cast<uint32_t>(wc[i].wr_id)))
        ++failed;
    }
    if (n > 0 || Clock::now() - looked < std::chrono::milliseconds(5)) continue;
    looked = Clock::now();
    if (::access(release.c_str(), F_OK) == 0) break;
    std::string client;
    const std::string k = std::to_string(rcs.size() + 1);
    if (!Get(dir + "/srq-client-" + k, &client)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      continue;
    }
    std::istringstream in(client);
    std::string ip_text;
    uint32_t ip = 0, qpn = 0;
    ibv_qp* rc = nullptr;
    if (!(in >> ip_text >> qpn) || !ParseIp(ip_text, &ip) ||
        (rc = NewQp(d.pd, d.cq, IBV_QPT_RC, srq)) == nullptr || !RcToRts(rc, ip, qpn)) {
      std::printf("srq victim: could not connect client %s (%s)\n", k.c_str(), client.c_str());
      ++failed;
      if (rc != nullptr) ibv_destroy_qp(rc);
      rcs.push_back(nullptr);
      continue;
    }
    rcs.push_back(rc);
    Put(dir + "/srq-ready-" + k, std::to_string(rc->qp_num));
  }
  const std::string fatal = FatalEvents(d.ctx);
  const std::string lost = fatal.empty() ? "" : "; " + fatal;
  std::printf("SRQ VICTIM: %lu SENDs of %zu RC clients and %lu datagrams received, %lu failed%s\n",
              static_cast<unsigned long>(on_rc), rcs.size(), static_cast<unsigned long>(on_ud),
              static_cast<unsigned long>(failed), lost.c_str());
  for (ibv_qp* rc : rcs)
    if (rc != nullptr) ibv_destroy_qp(rc);
  ibv_destroy_qp(ud);
  ibv_destroy_srq(srq);
  return failed == 0 && fatal.empty() ? 0 : 1;
}

int Send(const std::string& dir, const std::string& k, int count) {
  Device d;
  ibv_qp* qp = Open(&d, 4096) ? NewQp(d.pd, d.cq, IBV_QPT_RC) : nullptr;
  std::string victim, ready;
  uint32_t ip = 0, qpn = 0;
  std::string ip_text;
  if (qp == nullptr || !WaitFor(dir + "/srq-victim", &victim) ||
      !(std::istringstream(victim) >> ip_text) || !ParseIp(ip_text, &ip)) {
    std::fprintf(stderr, "srq client %s: no device, QP or victim\n", k.c_str());
    return 2;
  }
  Put(dir + "/srq-client-" + k, IpText(d.ip) + " " + std::to_string(qp->qp_num));
  if (!WaitFor(dir + "/srq-ready-" + k, &ready) || std::sscanf(ready.c_str(), "%u", &qpn) != 1 ||
      !RcToRts(qp, ip, qpn)) {
    std::fprintf(stderr, "srq client %s: the victim did not connect to it\n", k.c_str());
    return 2;
  }
  for (int i = 0; i < count; ++i) {
    const int len = std::snprintf(d.buf.data(), 64, "client %s send %d", k.c_str(), i);
    ibv_sge sge{reinterpret_cast<uintptr_t>(d.buf.data()), static_cast<uint32_t>(len + 1),
                d.mr->lkey};
    ibv_send_wr wr{};
    wr.wr_id = static_cast<uint64_t>(i);
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    ibv_send_wr* bad = nullptr;
    if (ibv_post_send(qp, &wr, &bad) != 0) {
      std::printf("srq client %s: post %d refused\n", k.c_str(), i);
      return 1;
    }
    ibv_wc wc{};
    int got = 0;
    const auto end = Clock::now() + kCompletionBound;
    while ((got = ibv_poll_cq(d.cq, 1, &wc)) == 0 && Clock::now() < end) {
    }
    if (got != 1 || wc.status != IBV_WC_SUCCESS) {
      std::printf(
          "srq client %s: SEND %d of %d: %s\n", k.c_str(), i, count,
          got != 1 ? "no completion in 10 s (no receive for it)" : ibv_wc_status_str(wc.status));
      return 1;
    }
  }
  std::printf("srq client %s: %d SENDs to the victim's SRQ completed\n", k.c_str(), count);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "serve") == 0) return Serve(argv[2]);
  if (argc == 5 && std::strcmp(argv[1], "send") == 0)
    return Send(argv[2], argv[3], std::atoi(argv[4]));
  std::fprintf(stderr, "usage: ffadversary_srq serve DIR | send DIR K COUNT\n");
  return 2;
}
