// fork(): what a process that forks after opening the device and registering memory keeps,
// and what its child gets.
//
// Registered memory with remote access lives in memfds mapped MAP_SHARED (memory.cc), which
// a child would inherit shared: its writes would reach the parent's registered buffers, and
// the peers reading them. The child handler makes the child's copy private (copy-on-write
// from the memfd), so the parent keeps its memory exactly as a kernel with copy-on-fork for
// pinned pages (Linux 5.13+, FOLL_PIN) gives it, and the child's pages are its own. The
// child also drops the parent's router session (closing its descriptors), so the router
// still sees the parent's connection end when the parent exits, and the child's first verb
// connects a session of its own. The parent's contexts are not the child's to use, as with
// a real device. Its rdma_cm channels (cm_device.h) stay open descriptors whose commands
// fail with ENODEV.
//
// Hence ibv_is_fork_initialized() answers IBV_FORK_UNNEEDED, as libibverbs does on such a
// kernel; ibv_fork_init() and RDMAV_FORK_SAFE then change nothing (libibverbs does not
// mark ranges MADV_DONTFORK in that case either), and ibv_dontfork_range/dofork_range
// succeed without effect.
#include <pthread.h>

#include "base/exports.h"
#include "rdmacm/cm_device.h"
#include "session/session.h"

namespace ff::verbs {
namespace {

void BeforeFork() {
  LockProcessSession();
  LockRegions();
  LockCmTable();
}

void AfterForkParent() {
  UnlockCmTable();
  UnlockRegions();
  UnlockProcessSession();
}

void AfterForkChild() {
  ForgetCmChannelsInChild();
  UnlockCmTable();
  PrivatizeRegionsInChild();
  UnlockRegions();
  ForgetProcessSessionInChild();
  UnlockProcessSession();
}

__attribute__((constructor)) void InstallForkHandlers() {
  ::pthread_atfork(BeforeFork, AfterForkParent, AfterForkChild);
}

}  // namespace
}  // namespace ff::verbs

extern "C" {

FFV_EXPORT int ibv_fork_init(void) { return 0; }
FFV_EXPORT ibv_fork_status ibv_is_fork_initialized(void) { return IBV_FORK_UNNEEDED; }
FFV_EXPORT int ibv_dontfork_range(void*, size_t) { return 0; }
FFV_EXPORT int ibv_dofork_range(void*, size_t) { return 0; }

}  // extern "C"
