// Opening and closing the device many times in one process, as test suites and middleware
// do: every cycle must succeed, and afterwards the process's descriptors, mappings and memory
// are back where they started (the router's side is checked by verbs_lifecycle.sh).
//
//   verbs_lifecycle cycles N GO_FILE [leave]   open, create PD/channel/CQ/QP/MR, destroy
//                                              (or, with `leave`, just close), N times;
//                                              prints BASELINE after the first cycle and
//                                              DONE after the last, and waits for GO_FILE
//                                              to appear after each (the script reads the
//                                              router's counters meanwhile; "-": no wait)
//   verbs_lifecycle devlist N                  ibv_get_device_list/ibv_free_device_list
#include <dirent.h>
#include <infiniband/verbs.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include "rc_pair.h"

namespace {

constexpr size_t kBuf = 64 * 1024;
// Growth of the resident set over all cycles that still counts as no leak: allocator
// slack. One leaked CQ ring per cycle alone would be ten times this over 1,000 cycles.
constexpr long kRssSlackKib = 2048;

[[noreturn]] void Die(const char* what, int i) {
  std::fprintf(stderr, "verbs_lifecycle: cycle %d: %s: %s\n", i, what, std::strerror(errno));
  std::exit(2);
}

int CountFds() {
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return -1;
  int n = 0;
  while (::readdir(d) != nullptr) ++n;
  ::closedir(d);
  return n;
}

int CountMaps() {
  std::ifstream in("/proc/self/maps");
  std::string line;
  int n = 0;
  while (std::getline(in, line)) ++n;
  return n;
}

long RssKib() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::strtol(line.c_str() + 6, nullptr, 10);
  return -1;
}

struct Usage {
  int fds, maps;
  long rss;
};
Usage Measure() { return {CountFds(), CountMaps(), RssKib()}; }

ibv_context* Open(int i) {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr || n != 1) Die("ibv_get_device_list", i);
  ibv_context* ctx = ibv_open_device(list[0]);
  ibv_free_device_list(list);
  if (ctx == nullptr) Die("ibv_open_device", i);
  return ctx;
}

void Cycle(int i, char* buf, bool leave) {
  ibv_context* ctx = Open(i);
  ibv_pd* pd = ibv_alloc_pd(ctx);
  if (pd == nullptr) Die("ibv_alloc_pd", i);
  ibv_comp_channel* ch = ibv_create_comp_channel(ctx);
  if (ch == nullptr) Die("ibv_create_comp_channel", i);
  ibv_cq* cq = ibv_create_cq(ctx, 256, nullptr, ch, 0);
  if (cq == nullptr) Die("ibv_create_cq", i);
  ibv_cq* cq2 = ibv_create_cq(ctx, 16, nullptr, nullptr, 0);
  if (cq2 == nullptr) Die("ibv_create_cq (no channel)", i);
  ibv_qp* qp = rcpair::NewRcQp(pd, cq, cq2, 64, IBV_ACCESS_REMOTE_WRITE);
  // A second context open beside the first: ids must not collide between them.
  ibv_context* other = Open(i);
  ibv_comp_channel* other_ch = ibv_create_comp_channel(other);
  if (other_ch == nullptr) Die("ibv_create_comp_channel (second context)", i);
  ibv_cq* other_cq = ibv_create_cq(other, 8, nullptr, other_ch, 0);
  if (other_cq == nullptr) Die("ibv_create_cq (second context)", i);
  if (ibv_destroy_cq(other_cq) != 0 || ibv_destroy_comp_channel(other_ch) != 0 ||
      ibv_close_device(other) != 0)
    Die("closing the second context", i);
  ibv_mr* mr = ibv_reg_mr(
      pd, buf, kBuf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  if (mr == nullptr) Die("ibv_reg_mr", i);
  if (!leave) {
    if (ibv_destroy_qp(qp) != 0) Die("ibv_destroy_qp", i);
    if (ibv_dereg_mr(mr) != 0) Die("ibv_dereg_mr", i);
    if (ibv_destroy_cq(cq) != 0) Die("ibv_destroy_cq", i);
    if (ibv_destroy_cq(cq2) != 0) Die("ibv_destroy_cq", i);
    if (ibv_destroy_comp_channel(ch) != 0) Die("ibv_destroy_comp_channel", i);
    if (ibv_dealloc_pd(pd) != 0) Die("ibv_dealloc_pd", i);
  }
  if (ibv_close_device(ctx) != 0) Die("ibv_close_device", i);
}

void AwaitGo(const char* go) {
  std::fflush(stdout);
  if (std::strcmp(go, "-") == 0) return;  // nobody reads the router's counters
  for (int i = 0; i < 600 && ::access(go, F_OK) != 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ::unlink(go);
}

bool Compare(const char* what, const Usage& before, const Usage& after) {
  std::printf("%s: fds %d -> %d, maps %d -> %d, rss %ld -> %ld KiB\n", what, before.fds, after.fds,
              before.maps, after.maps, before.rss, after.rss);
  const bool fds = after.fds == before.fds;
  const bool maps = after.maps == before.maps;
  const bool rss = after.rss - before.rss <= kRssSlackKib;
  if (!fds) std::printf("FAIL descriptors leaked\n");
  if (!maps) std::printf("FAIL mappings leaked\n");
  if (!rss) std::printf("FAIL memory grew\n");
  return fds && maps && rss;
}

int Cycles(int n, const char* go, bool leave) {
  char* buf = static_cast<char*>(std::aligned_alloc(4096, kBuf));
  std::memset(buf, 1, kBuf);
  Cycle(0, buf, leave);  // the session to the router stays: it is part of the baseline
  const Usage before = Measure();
  std::printf("BASELINE\n");
  AwaitGo(go);
  for (int i = 1; i <= n; ++i) Cycle(i, buf, leave);
  const Usage after = Measure();
  const bool ok = Compare(leave ? "cycles (left open)" : "cycles", before, after);
  std::printf("DONE %d cycles\n", n);
  AwaitGo(go);
  std::free(buf);
  return ok ? 0 : 1;
}

int DevList(int n) {
  ibv_free_device_list(ibv_get_device_list(nullptr));
  const Usage before = Measure();
  for (int i = 0; i < n; ++i) {
    int num = -1;
    ibv_device** list = ibv_get_device_list(&num);
    if (list == nullptr || num != 1 || list[0] == nullptr || list[1] != nullptr)
      Die("ibv_get_device_list", i);
    ibv_free_device_list(list);
  }
  return Compare("device lists", before, Measure()) ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "cycles" && argc >= 4)
    return Cycles(std::atoi(argv[2]), argv[3], argc > 4 && std::string(argv[4]) == "leave");
  if (mode == "devlist" && argc >= 3) return DevList(std::atoi(argv[2]));
  std::fprintf(stderr, "usage: verbs_lifecycle cycles N GO_FILE [leave] | devlist N\n");
  return 2;
}
