// Logging of a preloaded library: one line per call on stderr, "<prefix> <level>[pid]: ...",
// written with one write(2) through the next definition of write (so it neither goes
// through stdio, whose buffer a forked child would copy, nor comes back to the library's
// own interposer). Errors and information (what the user asked for, as a report at exit)
// always print; debug lines only when the library's environment variable says "debug".
// Never changes errno, so an entry point may log on its way out after it set errno for its
// caller. Not for the data path, except for events that end a connection.
#pragma once

#include <atomic>
#include <cstdarg>

namespace ff::preload {

// Who logs: the line's prefix, and the variable that turns debug lines on (read once).
struct LogIdentity {
  const char* prefix;
  const char* debug_env;
  std::atomic<int> debug_on{-1};  // -1: not read yet
};

enum class LogLevel { kError, kInfo, kDebug };

void VLog(LogIdentity& who, LogLevel level, const char* fmt, va_list ap);

}  // namespace ff::preload
