// The data path of an accelerated connection: bytes through the stream segment's rings,
// bells and the kernel connection's FIN/RST, waits that spin and then sleep in the kernel
// (docs/tcp-mode.md). `fd` is always a descriptor of the connection's kernel socket (the
// program's own), used for bells, the end of the connection and the socket's flags.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <cstdint>

#include "freeflow/fd.h"
#include "sock.h"

namespace ff::fsocket {

// Makes `s` a stream over the segment and side memfds and the bell the router gave (role
// kStreamClient or kStreamServer). 0 or EPROTO when they are not what SockReply promised.
int AttachStream(Sock& s, int segment_fd, int side_fd, ff::UniqueFd bell, uint32_t role,
                 uint32_t ring_bytes);

// recv/read/readv/recvmsg on a stream: returns bytes or -1 with errno set, as TCP would.
// flags: MSG_PEEK, MSG_WAITALL, MSG_DONTWAIT, MSG_TRUNC; MSG_OOB gives EINVAL.
ssize_t StreamRecv(Sock& s, int fd, const iovec* iov, int iovcnt, int flags);
// send/write/writev/sendmsg: bytes or -1 with errno; EPIPE raises SIGPIPE unless
// MSG_NOSIGNAL.
ssize_t StreamSend(Sock& s, int fd, const iovec* iov, int iovcnt, int flags);

// Readiness as poll(2) bits (POLLIN, POLLOUT, POLLRDHUP, POLLHUP, POLLERR), from the
// rings and what the kernel said so far; no system call.
short StreamReadiness(Sock& s);
// Before sleeping in the kernel for `events` (POLLIN: data; POLLOUT: room): asks the peer
// for a bell. The caller checks readiness again afterwards.
void StreamArm(Sock& s, short events);
// Takes the bells off the kernel socket and learns the peer's FIN or a reset.
void StreamDrain(Sock& s, int fd);
void DrainLocked(Sock& s, int fd);  // the same, the drain lock held (restricted processes)
// Records the socket's O_NONBLOCK for restricted processes (at attach; fcntl and ioctl keep it).
void NoteFlags(Sock& s, int fd);
// For a stream whose non-blocking connect is under way: true once the kernel connection is
// established (then the stream is open); false while it is not, or when it failed (then
// the kernel reports the failure on the descriptor).
bool StreamConnected(Sock& s, int fd);
// A dialed stream's kernel connection is established: the stream opens (once, whichever
// thread sees it first), and one bell goes on the kernel connection so that the server's
// kernel completes its side of the handshake even when it dropped our last ACK.
void StreamOpened(Sock& s, int fd);
// Bytes waiting to be read / sent (FIONREAD, SIOCOUTQ).
uint64_t StreamUnread(Sock& s);
uint64_t StreamUnsent(Sock& s);
// shutdown(2) on a stream (the kernel's shutdown is done by the caller).
void StreamShutdown(Sock& s, int how);
// The program closes its last descriptor of the stream in this process: no bell is left
// unread in the kernel socket (an unread byte would turn the FIN into a reset).
void StreamRelease(Sock& s, int fd);

// A stream's kernel socket carries a mark a program inherits across exec with it: its
// TCP_NOTSENT_LOWAT is kStreamTag (no kernel or program default has it; it only limits how
// many unsent bytes the kernel queues, which bells never approach). A library that finds
// the mark on a socket it did not make knows the socket's bytes are in a segment: it asks the
// router for it, and resets the connection cleanly when the router no longer has it.
// It also gets TCP_NODELAY: a bell must never wait in the kernel for the ACK of the one
// before (Nagle's algorithm, up to the peer's delayed ACK: 40 ms). The program's own
// TCP_NODELAY, read here first, is kept in s.app_nodelay (the sockopt interposers).
inline constexpr unsigned kStreamTag = 0xfffff7edu;
void TagStream(int fd, Sock& s);
bool IsTaggedStream(int fd);

// One step of a spin that has lasted `spun_ns`: a few pauses at first, then sched_yield, so
// that a peer the scheduler put on this CPU gets to run (two vCPUs: it often does). Pauses
// only in restricted processes (sched_yield may be outside their filter).
void SpinStep(uint64_t spun_ns);

// Whether a system call that a signal interrupted should start again, as the kernel decides
// it for a socket call without a timeout: only when every handler has SA_RESTART.
bool RestartAfterSignal();

}  // namespace ff::fsocket
