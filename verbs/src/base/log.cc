#include "base/log.h"

#include <cstdarg>

#include "freeflow/preload/log.h"

namespace ff::verbs {
namespace {

ff::preload::LogIdentity g_log{"freeflow", "FFV_LOG"};

}  // namespace

void LogError(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  ff::preload::VLog(g_log, ff::preload::LogLevel::kError, fmt, ap);
  va_end(ap);
}

void LogInfo(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  ff::preload::VLog(g_log, ff::preload::LogLevel::kInfo, fmt, ap);
  va_end(ap);
}

void LogDebug(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  ff::preload::VLog(g_log, ff::preload::LogLevel::kDebug, fmt, ap);
  va_end(ap);
}

}  // namespace ff::verbs
