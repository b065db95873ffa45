#include "log.h"

#include <stdarg.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace ffv {
namespace {

bool DebugEnabled() {
  static const bool on = [] {
    const char* v = std::getenv("FFV_LOG");
    return v != nullptr && std::strcmp(v, "debug") == 0;
  }();
  return on;
}

void VLog(const char* level, const char* fmt, va_list ap) {
  const int saved = errno;
  char line[512];
  const int n = std::vsnprintf(line, sizeof(line), fmt, ap);
  if (n > 0) std::fprintf(stderr, "freeflow %s: %s\n", level, line);
  errno = saved;
}

}  // namespace

void LogError(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  VLog("error", fmt, ap);
  va_end(ap);
}

void LogDebug(const char* fmt, ...) {
  if (!DebugEnabled()) return;
  va_list ap;
  va_start(ap, fmt);
  VLog("debug", fmt, ap);
  va_end(ap);
}

}  // namespace ffv
