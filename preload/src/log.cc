#include "freeflow/preload/log.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "freeflow/preload/interpose.h"

namespace ff::preload {
namespace {

bool DebugEnabled(LogIdentity& who) {
  int on = who.debug_on.load(std::memory_order_relaxed);
  if (on < 0) {
    const char* v = std::getenv(who.debug_env);
    on = v != nullptr && std::strcmp(v, "debug") == 0 ? 1 : 0;
    who.debug_on.store(on, std::memory_order_relaxed);
  }
  return on == 1;
}

}  // namespace

void VLog(LogIdentity& who, LogLevel level, const char* fmt, va_list ap) {
  const bool debug = level == LogLevel::kDebug;
  if (debug && !DebugEnabled(who)) return;
  const int saved = errno;
  char line[1024];  // a report (FFV_REPORT_WAITS) runs to about 530
  const char* name = debug ? "debug" : level == LogLevel::kInfo ? "info" : "error";
  int n = std::snprintf(line, sizeof(line), "%s %s[%d]: ", who.prefix, name, ::getpid());
  if (n > 0 && n < static_cast<int>(sizeof(line))) {
    const int m = std::vsnprintf(line + n, sizeof(line) - n, fmt, ap);
    if (m > 0) n = std::min<int>(n + m, sizeof(line) - 2);
    line[n++] = '\n';
    static std::atomic<ssize_t (*)(int, const void*, size_t)> next_write{};
    (void)CallNext(next_write, "write", STDERR_FILENO, static_cast<const void*>(line),
                   static_cast<size_t>(n));
  }
  errno = saved;
}

}  // namespace ff::preload
