// librdmacm's kernel device, /dev/infiniband/rdma_cm, served in the process. The real
// librdmacm runs unmodified: it opens the device, checks with fstat that it is a character
// device, and writes ucma commands to it (<rdma/rdma_user_cm.h>), one write() each. The
// library interposes open, write, close, dup2/dup3, close_range and the fstat family:
// - open of exactly that path, while this process has a router session, makes a
//   SOCK_SEQPACKET socketpair, hands one end to the router (CmOpenChannel: a "channel") and
//   gives the program the other end. The router writes the channel's events (CmEvent) there,
//   so poll/epoll and O_NONBLOCK work on it as on the kernel's device (cm_device.cc).
// - write() to such a descriptor is parsed as the kernel's ucma_write parses it; GET_EVENT
//   reads the next event from the socket, every other command goes to the router as a
//   CmCommand and its answer is copied to the command's `response` (cm_commands.cc).
// - The library keeps what only the program's side can know: which ids are live on which
//   channel and how many events of each the program has read (DESTROY_ID's, MIGRATE_ID's
//   and LEAVE_MCAST's events_reported, which librdmacm waits for), and it turns a router
//   that went away into one RDMA_CM_EVENT_DEVICE_REMOVAL per live id (cm_events.cc).
//
// Every other descriptor pays one load and one compare in write() and close() (MaybeCmFd,
// MaybeLibraryFd). The close family releases the marks of every kind at the numbers it
// released (base/fd_marks.h), under the table's lock, which is also the lock every mark is
// set under: a number closed and made again at once by another thread keeps its new mark.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "base/fd_marks.h"
#include "freeflow/tunables.h"

namespace ff::verbs {

struct Session;

inline constexpr const char* kCmDevicePath = "/dev/infiniband/rdma_cm";
// What fstat and stat answer for the device: a character device of the misc major (10),
// where the kernel's rdma_cm lives. Its minor is dynamic on a real system; 58 is arbitrary
// (librdmacm compares st_rdev only with a number it learned from netlink, and a pod has no
// rdma_cm there).
inline constexpr unsigned kCmMajor = 10;
inline constexpr unsigned kCmMinor = 58;

// True when `fd` may be an rdma_cm descriptor (then ask IsCmFd); false means it is not.
// cm_channel.cc marks them.
inline bool MaybeCmFd(int fd) { return g_library_fds.Maybe(fd, FdKind::kCmChannel); }
// True when `fd` may be any descriptor the library marked: the close family's test.
inline bool MaybeLibraryFd(int fd) { return g_library_fds.Maybe(fd); }

// True when `fd` is an open rdma_cm descriptor of this process (it checks that the number
// still names the socket it was opened as).
bool IsCmFd(int fd);

// The write() interposer's work for a descriptor MaybeCmFd marked: false when `fd` is not a
// channel after all (then it is an ordinary write), else the write's result in *result
// (the length, or -1 with errno set).
bool CmWrite(int fd, const void* buf, size_t len, ssize_t* result);

// Tests: channels opened from now on use `s` instead of the process-wide session (nullptr:
// none, as in a process without a router), until UseProcessCmSession. Close them before
// closing `s`.
void UseCmSession(Session* s);
void UseProcessCmSession();

// The table's lock: held across fork() (fork.cc), across a close-family call and the
// release of its numbers' marks, and while a mark of any kind is set. In a forked child the
// parent's channels stay open descriptors but every command on them fails with ENODEV (the
// router knows them as the parent's).
void LockCmTable();
void UnlockCmTable();
void ForgetCmChannelsInChild();

}  // namespace ff::verbs
