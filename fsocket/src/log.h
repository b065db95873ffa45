// Logging of libfsocket (freeflow/preload/log.h). Lines go to stderr as
// "freeflow-socket <level>[pid]: ...", one write(2) each; errors always print, debug lines
// only with FFS_LOG=debug. Never changes errno. Never on the data path except for events
// that end a connection.
#pragma once

namespace ffsock {

void Log(bool debug, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace ffsock

#define LogError(...) ::ffsock::Log(false, __VA_ARGS__)
#define LogDebug(...) ::ffsock::Log(true, __VA_ARGS__)
