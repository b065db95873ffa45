// Logging of the preloaded library. Lines go to stderr prefixed "freeflow"; errors always
// print, debug lines only with FFV_LOG=debug. Neither changes errno, so an entry point may
// log on its way out after it set errno for its caller. Never called on the data path except
// for events that end a connection.
#pragma once

namespace ffv {

void LogError(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void LogDebug(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace ffv
