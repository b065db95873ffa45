// The interposers that move bytes: the read and write families, sendfile, splice, and the
// ioctls that count bytes. A descriptor that names no stream goes straight to libc.
#include <fcntl.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <sys/ioctl.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "exports.h"
#include "real.h"
#include "sock.h"
#include "stream.h"

namespace ff::fsocket {
namespace {

Ref StreamOf(int fd) {
  Ref s = Lookup(fd);
  if (s && s->kind != Kind::kStream) return Ref();
  return s;
}

// TCP_NODELAY of a stream is the program's to see and set; the kernel connection keeps it on
// for the bells (TagStream). Every other option goes to the kernel socket.
bool IsNodelay(int level, int name, socklen_t len) {
  return level == IPPROTO_TCP && name == TCP_NODELAY && len >= static_cast<socklen_t>(sizeof(int));
}

ssize_t Recv1(Sock& s, int fd, void* buf, size_t len, int flags) {
  iovec v{buf, len};
  return StreamRecv(s, fd, &v, 1, flags);
}

ssize_t Send1(Sock& s, int fd, const void* buf, size_t len, int flags) {
  iovec v{const_cast<void*>(buf), len};
  return StreamSend(s, fd, &v, 1, flags);
}

void* NextFn(const char* name) { return real::Next(name); }

template <typename Fn>
Fn Next(const char* name) {
  return reinterpret_cast<Fn>(NextFn(name));
}

// A recvmsg on a stream: no address, no ancillary data (TCP has none to give).
ssize_t StreamRecvMsg(Sock& s, int fd, msghdr* m, int flags) {
  if (m->msg_iovlen > IOV_MAX) {
    errno = EMSGSIZE;
    return -1;
  }
  const ssize_t n = StreamRecv(s, fd, m->msg_iov, static_cast<int>(m->msg_iovlen), flags);
  if (n >= 0) {
    m->msg_namelen = 0;
    m->msg_controllen = 0;
    m->msg_flags = 0;
  }
  return n;
}

ssize_t StreamSendMsg(Sock& s, int fd, const msghdr* m, int flags) {
  if (m->msg_iovlen > IOV_MAX) {
    errno = EMSGSIZE;
    return -1;
  }
  return StreamSend(s, fd, m->msg_iov, static_cast<int>(m->msg_iovlen), flags);
}

// Bytes from `in` (a file, a pipe) into the stream, through a bounce buffer: never reads
// more than the stream takes at once, so that nothing read is lost. `offset` as sendfile's.
ssize_t CopyIntoStream(Sock& s, int out, int in, off_t* offset, size_t count) {
  static thread_local char buf[128 * 1024];
  size_t done = 0;
  while (done < count) {
    size_t want = std::min(count - done, sizeof(buf));
    const uint64_t room = s.ring_bytes - StreamUnsent(s);  // StreamUnsent <= ring_bytes
    if (done > 0 && room == 0) break;
    if (room > 0) want = std::min<size_t>(want, room);
    ssize_t got;
    if (offset != nullptr) {
      got = ::pread(in, buf, want, *offset);
    } else {
      got = real::read(in, buf, want);
    }
    if (got <= 0) {
      if (done > 0) break;
      return got;
    }
    const ssize_t put = Send1(s, out, buf, static_cast<size_t>(got), 0);
    if (put < 0) return done > 0 ? static_cast<ssize_t>(done) : put;
    if (offset != nullptr) *offset += put;
    done += static_cast<size_t>(put);
    if (put < got) break;  // a non-blocking stream took part of it: the rest stays unread
  }
  return static_cast<ssize_t>(done);
}

}  // namespace
}  // namespace ff::fsocket

using namespace ff::fsocket;

extern "C" {

FFS_EXPORT ssize_t read(int fd, void* buf, size_t len) {
  if (Ref s = StreamOf(fd)) return Recv1(*s, fd, buf, len, 0);
  return real::read(fd, buf, len);
}

FFS_EXPORT ssize_t __read_chk(int fd, void* buf, size_t len, size_t buflen) {
  if (len > buflen) __builtin_trap();
  return read(fd, buf, len);
}

FFS_EXPORT ssize_t write(int fd, const void* buf, size_t len) {
  if (Ref s = StreamOf(fd)) return Send1(*s, fd, buf, len, 0);
  return real::write(fd, buf, len);
}

FFS_EXPORT ssize_t readv(int fd, const iovec* iov, int n) {
  if (Ref s = StreamOf(fd)) {
    if (n < 0 || n > IOV_MAX) return errno = EINVAL, -1;
    return StreamRecv(*s, fd, iov, n, 0);
  }
  static auto next = Next<ssize_t (*)(int, const iovec*, int)>("readv");
  return next(fd, iov, n);
}

FFS_EXPORT ssize_t writev(int fd, const iovec* iov, int n) {
  if (Ref s = StreamOf(fd)) {
    if (n < 0 || n > IOV_MAX) return errno = EINVAL, -1;
    return StreamSend(*s, fd, iov, n, 0);
  }
  static auto next = Next<ssize_t (*)(int, const iovec*, int)>("writev");
  return next(fd, iov, n);
}

FFS_EXPORT ssize_t recv(int fd, void* buf, size_t len, int flags) {
  if (Ref s = StreamOf(fd)) return Recv1(*s, fd, buf, len, flags);
  return real::recv(fd, buf, len, flags);
}

FFS_EXPORT ssize_t __recv_chk(int fd, void* buf, size_t len, size_t buflen, int flags) {
  if (len > buflen) __builtin_trap();
  return recv(fd, buf, len, flags);
}

FFS_EXPORT ssize_t recvfrom(int fd, void* buf, size_t len, int flags, sockaddr* from,
                            socklen_t* fromlen) {
  if (Ref s = StreamOf(fd)) {
    const ssize_t n = Recv1(*s, fd, buf, len, flags);
    if (n >= 0 && from != nullptr && fromlen != nullptr) *fromlen = 0;
    return n;
  }
  static auto next = Next<ssize_t (*)(int, void*, size_t, int, sockaddr*, socklen_t*)>("recvfrom");
  return next(fd, buf, len, flags, from, fromlen);
}

FFS_EXPORT ssize_t __recvfrom_chk(int fd, void* buf, size_t len, size_t buflen, int flags,
                                  sockaddr* from, socklen_t* fromlen) {
  if (len > buflen) __builtin_trap();
  return recvfrom(fd, buf, len, flags, from, fromlen);
}

FFS_EXPORT ssize_t recvmsg(int fd, msghdr* m, int flags) {
  if (Ref s = StreamOf(fd)) return StreamRecvMsg(*s, fd, m, flags);
  static auto next = Next<ssize_t (*)(int, msghdr*, int)>("recvmsg");
  return next(fd, m, flags);
}

FFS_EXPORT ssize_t send(int fd, const void* buf, size_t len, int flags) {
  if (Ref s = StreamOf(fd)) return Send1(*s, fd, buf, len, flags);
  return real::send(fd, buf, len, flags);
}

FFS_EXPORT ssize_t sendto(int fd, const void* buf, size_t len, int flags, const sockaddr* to,
                          socklen_t tolen) {
  if (Ref s = StreamOf(fd)) return Send1(*s, fd, buf, len, flags);  // TCP ignores `to`
  static auto next =
      Next<ssize_t (*)(int, const void*, size_t, int, const sockaddr*, socklen_t)>("sendto");
  return next(fd, buf, len, flags, to, tolen);
}

FFS_EXPORT ssize_t sendmsg(int fd, const msghdr* m, int flags) {
  if (Ref s = StreamOf(fd)) return StreamSendMsg(*s, fd, m, flags);
  static auto next = Next<ssize_t (*)(int, const msghdr*, int)>("sendmsg");
  return next(fd, m, flags);
}

FFS_EXPORT int recvmmsg(int fd, mmsghdr* v, unsigned n, int flags, timespec* timeout) {
  if (Ref s = StreamOf(fd)) {
    // A stream has no message boundaries: one message per call, as TCP gives.
    if (n == 0) return 0;
    const ssize_t got = StreamRecvMsg(*s, fd, &v[0].msg_hdr, flags & ~MSG_WAITFORONE);
    if (got < 0) return -1;
    v[0].msg_len = static_cast<unsigned>(got);
    return 1;
  }
  static auto next = Next<int (*)(int, mmsghdr*, unsigned, int, timespec*)>("recvmmsg");
  return next(fd, v, n, flags, timeout);
}

FFS_EXPORT int sendmmsg(int fd, mmsghdr* v, unsigned n, int flags) {
  if (Ref s = StreamOf(fd)) {
    unsigned i = 0;
    for (; i < n; ++i) {
      const ssize_t put = StreamSendMsg(*s, fd, &v[i].msg_hdr, flags);
      if (put < 0) return i > 0 ? static_cast<int>(i) : -1;
      v[i].msg_len = static_cast<unsigned>(put);
    }
    return static_cast<int>(i);
  }
  static auto next = Next<int (*)(int, mmsghdr*, unsigned, int)>("sendmmsg");
  return next(fd, v, n, flags);
}

FFS_EXPORT ssize_t sendfile(int out, int in, off_t* offset, size_t count) {
  if (Ref s = StreamOf(out)) return CopyIntoStream(*s, out, in, offset, count);
  static auto next = Next<ssize_t (*)(int, int, off_t*, size_t)>("sendfile");
  return next(out, in, offset, count);
}

FFS_EXPORT ssize_t sendfile64(int out, int in, off64_t* offset, size_t count) {
  static_assert(sizeof(off64_t) == sizeof(off_t));
  return sendfile(out, in, reinterpret_cast<off_t*>(offset), count);
}

FFS_EXPORT int ioctl(int fd, unsigned long req, ...) {
  va_list ap;
  va_start(ap, req);
  void* arg = va_arg(ap, void*);
  va_end(ap);
  if (req == FIONREAD || req == SIOCOUTQ) {
    if (Ref s = StreamOf(fd); s && s->state.load() == StreamState::kOpen) {
      const uint64_t n = req == FIONREAD ? StreamUnread(*s) : StreamUnsent(*s);
      *static_cast<int*>(arg) = static_cast<int>(std::min<uint64_t>(n, INT_MAX));
      return 0;
    }
  }
  static auto next = Next<int (*)(int, unsigned long, ...)>("ioctl");
  const int rc = next(fd, req, arg);
  if (rc == 0 && req == FIONBIO && arg != nullptr) {
    if (Ref s = StreamOf(fd)) s->nonblock.store(*static_cast<int*>(arg) != 0);
  }
  return rc;
}

FFS_EXPORT int setsockopt(int fd, int level, int name, const void* val, socklen_t len) {
  if (val != nullptr && IsNodelay(level, name, len)) {
    if (Ref s = StreamOf(fd)) {
      s->app_nodelay.store(*static_cast<const int*>(val) != 0);
      return 0;
    }
  }
  const int rc = real::setsockopt(fd, level, name, val, len);
  if (rc == 0 && level == SOL_SOCKET && (name == SO_RCVTIMEO || name == SO_SNDTIMEO)) {
    if (Ref s = StreamOf(fd)) {  // a wait asks the kernel again
      (name == SO_RCVTIMEO ? s->rcv_timeout_ms : s->snd_timeout_ms).store(kTimeoutUnknown);
    }
  }
  return rc;
}

FFS_EXPORT int getsockopt(int fd, int level, int name, void* val, socklen_t* len) {
  if (val != nullptr && len != nullptr && IsNodelay(level, name, *len)) {
    if (Ref s = StreamOf(fd)) {
      *static_cast<int*>(val) = s->app_nodelay.load() ? 1 : 0;
      *len = sizeof(int);
      return 0;
    }
  }
  return real::getsockopt(fd, level, name, val, len);
}

}  // extern "C"

extern "C" FFS_EXPORT ssize_t splice(int in, loff_t* in_off, int out, loff_t* out_off, size_t len,
                                     unsigned flags) {
  Ref sin = StreamOf(in);
  Ref sout = StreamOf(out);
  if (!sin && !sout) {
    static auto next = Next<ssize_t (*)(int, loff_t*, int, loff_t*, size_t, unsigned)>("splice");
    return next(in, in_off, out, out_off, len, flags);
  }
  if (sin && sout) return errno = EINVAL, -1;  // one end of a splice must be a pipe
  const int nb = (flags & SPLICE_F_NONBLOCK) ? MSG_DONTWAIT : 0;
  if (sout) {
    if (in_off != nullptr) return errno = ESPIPE, -1;
    return CopyIntoStream(*sout, out, in, nullptr, len);
  }
  // Stream to pipe: look at the bytes, hand the pipe what it takes, consume only that.
  static thread_local char buf[64 * 1024];
  const ssize_t got = Recv1(*sin, in, buf, std::min(len, sizeof(buf)), MSG_PEEK | nb);
  if (got <= 0) return got;
  const ssize_t put = out_off != nullptr ? ::pwrite(out, buf, got, *out_off)
                                         : real::write(out, buf, static_cast<size_t>(got));
  if (put <= 0) return put;
  if (out_off != nullptr) *out_off += put;
  return Recv1(*sin, in, nullptr, static_cast<size_t>(put), MSG_TRUNC | MSG_DONTWAIT);
}
