// Logging of libfsocket (freeflow/preload/log.h). Lines go to stderr as
// "freeflow-socket <level>[pid]: ...", one write(2) each; errors always print, debug lines
// only with FFS_LOG=debug. Never changes errno. Never on the data path except for events
// that end a connection.
#pragma once

namespace ff::fsocket {

void Log(bool debug, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace ff::fsocket

#define LogError(...) ::ff::fsocket::Log(false, __VA_ARGS__)
#define LogDebug(...) ::ff::fsocket::Log(true, __VA_ARGS__)
