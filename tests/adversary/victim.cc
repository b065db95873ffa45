// ffadversary_victim DIR: the victim of the adversary suite, an ordinary pod that uses the
// real library (run it under LD_PRELOAD=libffverbs.so). It registers two pages of secrets,
// one with IBV_ACCESS_LOCAL_WRITE only (nobody else may ever reach it) and one with
// IBV_ACCESS_REMOTE_READ only (only a peer it connects to, which it never does), creates an
// RC QP left in INIT and a UD QP, and describes itself in DIR/victim (victim.h). It then
// watches both pages until DIR/victim.release appears and exits 0 only when no byte of
// either ever changed (a change is reported when seen; the victim stays until released) and
// its device never reported a fatal error (the library's word for a lost router session).
#include "victim.h"

#include <infiniband/verbs.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "victim_verbs.h"

namespace {

using ff::adversary::FatalEvents;
using ff::adversary::kSecretMarker;
using ff::adversary::kVictimFile;
using ff::adversary::kVictimRelease;
using ff::adversary::NewQp;
using ff::adversary::UdToRts;

constexpr size_t kPage = 4096;

// A page of secrets registered with `access`, and the copy it is checked against.
struct Secret {
  const char* name = "";
  char* page = nullptr;
  std::vector<char> expected;
  ibv_mr* mr = nullptr;
};

bool Register(ibv_pd* pd, Secret* s, const char* name, int access) {
  s->name = name;
  void* p = ::mmap(nullptr, kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return false;
  s->page = static_cast<char*>(p);
  for (size_t i = 0; i < kPage; ++i) s->page[i] = static_cast<char>('a' + i % 26);
  const std::string head = std::string(kSecretMarker) + name;
  std::memcpy(s->page, head.data(), head.size());
  s->expected.assign(s->page, s->page + kPage);
  s->mr = ibv_reg_mr(pd, s->page, kPage, access);
  return s->mr != nullptr;
}

// RC: INIT with every remote right, as a pod that would connect later leaves it.
bool InitRc(ibv_qp* qp) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC;
  return ibv_modify_qp(qp, &a,
                       IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0;
}

// Watches the secrets until `release` exists (at most 10 minutes), staying a target all that
// time; the first change seen, "" when none.
std::string Watch(const std::vector<Secret*>& secrets, const std::string& release) {
  std::string changed;
  for (int i = 0; i < 30000 && ::access(release.c_str(), F_OK) != 0; ++i) {
    for (const Secret* s : secrets) {
      if (changed.empty() && std::memcmp(s->page, s->expected.data(), kPage) != 0) {
        changed = std::string("the page registered ") + s->name + " changed";
        std::printf("VICTIM: %s\n", changed.c_str());
        std::fflush(stdout);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return changed;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: ffadversary_victim DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  ibv_context* ctx = list != nullptr && n > 0 ? ibv_open_device(list[0]) : nullptr;
  ibv_pd* pd = ctx != nullptr ? ibv_alloc_pd(ctx) : nullptr;
  ibv_cq* cq = pd != nullptr ? ibv_create_cq(ctx, 16, nullptr, nullptr, 0) : nullptr;
  Secret local, readable;
  ibv_gid gid{};
  if (cq == nullptr || !Register(pd, &local, "local-write-only", IBV_ACCESS_LOCAL_WRITE) ||
      !Register(pd, &readable, "remote-read-only", IBV_ACCESS_REMOTE_READ) ||
      ibv_query_gid(ctx, 1, 1, &gid) != 0) {
    std::fprintf(stderr, "victim: could not set up its device, PD, CQ and MRs\n");
    return 2;
  }
  ibv_qp* rc = NewQp(pd, cq, IBV_QPT_RC);
  ibv_qp* ud = NewQp(pd, cq, IBV_QPT_UD);
  if (rc == nullptr || ud == nullptr || !InitRc(rc) || !UdToRts(ud)) {
    std::fprintf(stderr, "victim: could not set up its QPs\n");
    return 2;
  }
  char ip[32];
  std::snprintf(ip, sizeof(ip), "%u.%u.%u.%u", gid.raw[12], gid.raw[13], gid.raw[14], gid.raw[15]);
  {
    std::ofstream out(dir + "/" + kVictimFile + ".tmp");
    out << ip << " " << rc->qp_num << " " << ud->qp_num << "\n";
  }
  std::rename((dir + "/" + kVictimFile + ".tmp").c_str(), (dir + "/" + kVictimFile).c_str());
  std::printf("victim %s: RC QP %#x (INIT), UD QP %#x, two pages of secrets\n", ip, rc->qp_num,
              ud->qp_num);
  std::fflush(stdout);
  const std::string changed = Watch({&local, &readable}, dir + "/" + kVictimRelease);
  const std::string fatal = FatalEvents(ctx);
  if (changed.empty()) {
    std::printf("VICTIM intact: no byte of its secrets changed\n");
  } else {
    std::printf("VICTIM CHANGED: %s\n", changed.c_str());
  }
  if (!fatal.empty()) std::printf("VICTIM LOST ITS DEVICE: %s\n", fatal.c_str());
  ibv_destroy_qp(rc);
  ibv_destroy_qp(ud);
  ibv_dereg_mr(local.mr);
  ibv_dereg_mr(readable.mr);
  ibv_destroy_cq(cq);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
  ibv_free_device_list(list);
  return changed.empty() && fatal.empty() ? 0 : 1;
}
