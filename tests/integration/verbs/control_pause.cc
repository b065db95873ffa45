// An ordinary verbs program (linked against the system libibverbs, run under the freeflow
// preload) that asks the router for something without pause: it registers and deregisters a
// memory region (two requests the router answers) over and over for SECONDS, and prints how
// many pairs it made, how many failed, and the longest and median pair. Across a router
// hand-over (docs/handover.md) the longest pair is the control-path pause this process saw;
// a failed pair is a request that did not wait through it.
//
//   control_pause SECONDS
#include <infiniband/verbs.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

constexpr size_t kRegion = 4096;
constexpr size_t kMaxPairs = 4'000'000;  // bounds the figures kept, whatever SECONDS is

[[noreturn]] void Die(const char* what) {
  std::fprintf(stderr, "control_pause: %s\n", what);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  const int seconds = argc == 2 ? std::atoi(argv[1]) : 0;
  if (seconds <= 0 || seconds > 600) Die("usage: control_pause SECONDS (1-600)");
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr || n == 0) Die("no RDMA device");
  ibv_context* ctx = ibv_open_device(list[0]);
  if (ctx == nullptr) Die("cannot open the device");
  ibv_pd* pd = ibv_alloc_pd(ctx);
  if (pd == nullptr) Die("cannot allocate a protection domain");
  static char region[kRegion];

  using Clock = std::chrono::steady_clock;
  const Clock::time_point end = Clock::now() + std::chrono::seconds(seconds);
  std::vector<double> us;
  us.reserve(1 << 16);
  size_t failed = 0;
  while (Clock::now() < end && us.size() < kMaxPairs) {
    const Clock::time_point t0 = Clock::now();
    ibv_mr* mr = ibv_reg_mr(pd, region, kRegion, IBV_ACCESS_LOCAL_WRITE);
    const bool ok = mr != nullptr && ibv_dereg_mr(mr) == 0;
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    if (!ok) ++failed;
  }
  if (us.empty()) Die("no request made");
  std::vector<double> sorted = us;
  std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
  const double median = sorted[sorted.size() / 2];
  const double longest = *std::max_element(us.begin(), us.end());
  std::printf(
      "control_pause: %zu register/deregister pairs, %zu failed, longest %.1f ms, median %.1f us\n",
      us.size(), failed, longest / 1000.0, median);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
  ibv_free_device_list(list);
  return failed == 0 ? 0 : 1;
}
