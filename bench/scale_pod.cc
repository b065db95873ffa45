// One pod of the scale benchmark (bench/scale.sh, issue 40): a plain verbs program that opens
// the device, creates QPS RC QPs, registers MIB MiB and brings every QP to RTS towards a QP
// of its partner pod (or, when it is its own partner, towards its neighbour QP), then holds
// all of it until it is killed.
//
//   scale_pod DIR ID PARTNER QPS MIB
//
// The pods meet through files in DIR (a folder of the benchmark's, outside every pod's
// view of freeflow): DIR/ID.info holds the pod's GID (index 1, its overlay address) and its
// QP numbers; DIR/ID.ready appears once its QPs are all at RTS. Every wait is bounded.
#include <infiniband/verbs.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "rc_pair.h"

namespace {

constexpr uint32_t kDepth = 4;       // WRs each way: the rings stay small, as many QPs' do
constexpr int kPartnerWaitS = 300;   // the partner's QPs appear within this
constexpr int kHoldS = 4 * 60 * 60;  // a pod nobody kills goes by itself after this

struct Info {
  uint8_t gid[16] = {};
  std::vector<uint32_t> qpns;
};

std::string Hex(const uint8_t* p, size_t n) {
  std::ostringstream o;
  for (size_t i = 0; i < n; ++i) o << std::hex << std::setw(2) << std::setfill('0') << +p[i];
  return o.str();
}

// Writes `text` to `path` whole (a reader never sees part of it).
void Publish(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp);
    f << text;
    if (!f.flush()) rcpair::Die(("write " + tmp).c_str());
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) rcpair::Die(("rename " + path).c_str());
}

// The partner's info, waited for; false when it does not come or cannot be read.
bool ReadInfo(const std::string& path, size_t qps, Info* out) {
  for (int i = 0; i < kPartnerWaitS * 20; ++i) {
    std::ifstream f(path);
    if (f) {
      std::string gid;
      f >> gid;
      if (gid.size() != 32) return false;
      for (size_t b = 0; b < 16; ++b) out->gid[b] = std::stoi(gid.substr(2 * b, 2), nullptr, 16);
      uint32_t qpn = 0;
      while (f >> qpn) out->qpns.push_back(qpn);
      return out->qpns.size() == qps;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s DIR ID PARTNER QPS MIB\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1], id = argv[2], partner = argv[3];
  const size_t qps = std::strtoul(argv[4], nullptr, 10);
  const size_t bytes = std::strtoul(argv[5], nullptr, 10) << 20;
  if (qps == 0 || qps > 4096 || (partner == id && qps % 2 != 0) || bytes == 0) {
    std::fprintf(stderr,
                 "scale_pod: QPS must be 1..4096 (even for a pod of its own) and MIB > 0\n");
    return 2;
  }
  ibv_context* ctx = rcpair::OpenFirstDevice();
  ibv_pd* pd = ibv_alloc_pd(ctx);
  ibv_cq* cq = pd != nullptr ? ibv_create_cq(ctx, 2 * kDepth, nullptr, nullptr, 0) : nullptr;
  if (cq == nullptr) rcpair::Die("PD and CQ");
  Info self;
  if (ibv_query_gid(ctx, 1, 1, reinterpret_cast<ibv_gid*>(self.gid)) != 0) rcpair::Die("query gid");
  std::vector<ibv_qp*> qp(qps);
  for (size_t i = 0; i < qps; ++i) {
    qp[i] = rcpair::NewRcQp(pd, cq, cq, kDepth, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
    self.qpns.push_back(qp[i]->qp_num);
  }
  auto* buf = static_cast<char*>(std::aligned_alloc(4096, bytes));
  if (buf == nullptr) rcpair::Die("memory");
  std::memset(buf, 1, bytes);
  if (ibv_reg_mr(pd, buf, bytes, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE) == nullptr)
    rcpair::Die("register memory");
  std::string text = Hex(self.gid, 16);
  for (uint32_t n : self.qpns) text += " " + std::to_string(n);
  Publish(dir + "/" + id + ".info", text + "\n");

  Info peer;
  if (partner == id) {
    peer = self;
    for (size_t i = 0; i < qps; ++i) peer.qpns[i] = self.qpns[i ^ 1];
  } else if (!ReadInfo(dir + "/" + partner + ".info", qps, &peer)) {
    std::fprintf(stderr, "scale_pod %s: no usable info from pod %s\n", id.c_str(), partner.c_str());
    return 1;
  }
  for (size_t i = 0; i < qps; ++i) rcpair::ToRts(qp[i], peer.qpns[i], peer.gid, 7, 1);
  Publish(dir + "/" + id + ".ready", "ready\n");
  for (int i = 0; i < kHoldS; ++i) ::sleep(1);
  return 0;
}
