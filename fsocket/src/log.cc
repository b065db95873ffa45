#include "log.h"

#include <cstdarg>

#include "freeflow/preload/log.h"

namespace ff::fsocket {
namespace {

ff::preload::LogIdentity g_log{"freeflow-socket", "FFS_LOG"};

}  // namespace

void Log(bool debug, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  ff::preload::VLog(g_log, debug ? ff::preload::LogLevel::kDebug : ff::preload::LogLevel::kError,
                    fmt, ap);
  va_end(ap);
}

}  // namespace ff::fsocket
