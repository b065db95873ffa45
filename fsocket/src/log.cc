#include "log.h"

#include <stdarg.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "real.h"

namespace ffsock {
namespace {

bool DebugEnabled() {
  static const bool on = [] {
    const char* v = std::getenv("FFS_LOG");
    return v != nullptr && std::strcmp(v, "debug") == 0;
  }();
  return on;
}

}  // namespace

// One write(2) per line, past stdio (whose buffer a forked child would copy) and past this
// library's own write.
void Log(bool debug, const char* fmt, ...) {
  if (debug && !DebugEnabled()) return;
  const int saved = errno;
  char line[512];
  int n = std::snprintf(line, sizeof(line), "freeflow-socket %s[%d]: ", debug ? "debug" : "error",
                        ::getpid());
  if (n > 0 && n < static_cast<int>(sizeof(line))) {
    va_list ap;
    va_start(ap, fmt);
    const int m = std::vsnprintf(line + n, sizeof(line) - n, fmt, ap);
    va_end(ap);
    if (m > 0) n = std::min<int>(n + m, sizeof(line) - 2);
    line[n++] = '\n';
    (void)real::write(STDERR_FILENO, line, n);
  }
  errno = saved;
}

}  // namespace ffsock
