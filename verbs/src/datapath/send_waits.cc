#include "datapath/send_waits.h"

#include <time.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "base/log.h"

namespace ff::verbs {

std::atomic<bool> send_waits_detail::on{[] {
  const char* v = std::getenv("FFV_REPORT_WAITS");
  return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
}()};

namespace {

struct Wait {
  uint64_t ns = 0;
  uint64_t began_unix_ns = 0;  // CLOCK_REALTIME
  uint32_t qpn = 0;
};

// Constant-initialised: QPs may retire WQEs from an atexit handler, after static destructors.
std::atomic<uint64_t> g_retired{0};
std::atomic<uint64_t> g_floor_ns{0};  // the shortest wait kept, once kSendWaitsKept are
constinit std::mutex g_mu;
constinit std::array<Wait, kSendWaitsKept> g_longest{};  // longest first

[[gnu::destructor]] void ReportSendWaits() {
  if (!SendWaitsOn()) return;
  // What the program printed comes first, so that the report is a line of its own in a log
  // that holds both.
  std::fflush(stdout);
  LogInfo("%s", SendWaitsReport().c_str());
}

}  // namespace

std::string SendWaitsReport() {
  const uint64_t n = g_retired.load(std::memory_order_relaxed);
  std::lock_guard<std::mutex> g(g_mu);
  if (n == 0 || g_longest[0].ns == 0)
    return "FFV_REPORT_WAITS: no send queue of this process retired a work request";
  std::string kept;
  for (const Wait& w : g_longest) {
    if (w.ns == 0) break;
    char one[96];
    std::snprintf(one, sizeof(one), "%s%.2f ms from %llu.%03llu (QP %#x)", kept.empty() ? "" : ", ",
                  static_cast<double>(w.ns) / 1e6,
                  static_cast<unsigned long long>(w.began_unix_ns / 1'000'000'000u),
                  static_cast<unsigned long long>(w.began_unix_ns / 1'000'000u % 1000u), w.qpn);
    kept += one;
  }
  char head[192];
  std::snprintf(head, sizeof(head),
                "FFV_REPORT_WAITS: the longest a send queue waited with work outstanding: %.2f ms "
                "(QP %#x; %llu work requests retired); the longest, each from when it began "
                "(Unix time): ",
                static_cast<double>(g_longest[0].ns) / 1e6, g_longest[0].qpn,
                static_cast<unsigned long long>(n));
  return head + kept;
}

void ResetSendWaitsForTest(bool on) {
  std::lock_guard<std::mutex> g(g_mu);
  g_longest = {};
  g_floor_ns.store(0, std::memory_order_relaxed);
  g_retired.store(0, std::memory_order_relaxed);
  send_waits_detail::on.store(on, std::memory_order_relaxed);
}

void NoteSendWait(uint32_t qpn, uint64_t waited_ns) {
  g_retired.fetch_add(1, std::memory_order_relaxed);
  if (waited_ns <= g_floor_ns.load(std::memory_order_relaxed)) return;
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  const uint64_t now_ns =
      static_cast<uint64_t>(now.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(now.tv_nsec);
  std::lock_guard<std::mutex> g(g_mu);
  const Wait w{waited_ns, now_ns - std::min(now_ns, waited_ns), qpn};
  auto at = std::find_if(g_longest.begin(), g_longest.end(),
                         [&](const Wait& k) { return k.ns < waited_ns; });
  if (at == g_longest.end()) return;
  std::move_backward(at, g_longest.end() - 1, g_longest.end());
  *at = w;
  g_floor_ns.store(g_longest.back().ns, std::memory_order_relaxed);
}

}  // namespace ff::verbs
