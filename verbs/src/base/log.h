// Logging of the preloaded library (freeflow/preload/log.h): lines on stderr prefixed
// "freeflow"; errors and reports always print, debug lines only with FFV_LOG=debug. None
// changes errno. Never called on the data path except for events that end a connection.
#pragma once

namespace ff::verbs {

void LogError(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void LogDebug(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
// A line the user asked for (a report), always printed.
void LogInfo(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace ff::verbs
