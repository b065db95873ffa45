// GET_EVENT, and DEVICE_REMOVAL when the router goes away (cm_device.h).
//
// The router writes one CmEvent per datagram into its end of the channel socket; GET_EVENT
// reads the next one from the program's end (blocking or not, as the descriptor is), drops
// what is not for a live id of this process, counts the rest (cmtable::CountEvent) and
// copies the kernel's event to the program.
//
// The router closing its end (it died, or dropped the channel) makes the socket read EOF
// forever: a blocked rdma_get_cm_event would return, then a poll loop would spin. So the
// library swaps the socket behind the program's descriptor number for one it made (dup3,
// keeping close-on-exec and non-blocking), writes one RDMA_CM_EVENT_DEVICE_REMOVAL per live
// id of the channel into it and keeps its writing end open: the program reads those
// events, then the descriptor is idle for good, as a removed kernel device's is. Events
// that do not fit the socket's buffer wait in `pending` and follow as the program reads.
// An epoll set loses the descriptor in the swap (it watched the old socket), after
// reporting it readable (EOF): a program that reads events until EAGAIN then still gets
// every DEVICE_REMOVAL.
#include <fcntl.h>
#include <poll.h>
#include <rdma/rdma_user_cm.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "base/log.h"
#include "freeflow/preload/interpose.h"
#include "rdmacm/cm_channel.h"
#include "session/session.h"

namespace ff::verbs {
namespace {

using ff::proto::CmEvent;
static_assert(sizeof(rdma_ucm_event_resp) == ff::proto::kCmEventRespBytes);

// The kernel's smallest answer: the event without its trailing reserved word and ECE.
constexpr size_t kMinEventOut =
    sizeof(rdma_ucm_event_resp) - sizeof(uint32_t) - sizeof(rdma_ucm_ece);

constexpr int kEof = -1;        // the router closed its end
constexpr int kMalformed = -2;  // a datagram that is not one CmEvent (dropped)

// Reads one event: without waiting (`how` kDontWait), as the descriptor's flags say
// (kAsFlags), or polling a while first on a blocking descriptor (kSpinFirst: the event a
// command causes usually follows it within microseconds, and waking costs more).
enum class Wait { kDontWait, kAsFlags, kSpinFirst };
int ReadEvent(int fd, Wait how, CmEvent* ev) {
  struct {
    CmEvent ev;
    char more[8];  // a longer datagram shows as more bytes than a CmEvent
  } buf;
  ssize_t n = -1;
  int rc = EAGAIN;
  if (how == Wait::kSpinFirst) {
    rc = SpinForAnswer(ProcessRingControl(), [&] {
      n = ::recv(fd, &buf, sizeof(buf), MSG_DONTWAIT);
      return n < 0 ? errno : 0;
    });
  }
  if (rc == EAGAIN) {
    n = ::recv(fd, &buf, sizeof(buf), how == Wait::kDontWait ? MSG_DONTWAIT : 0);
    rc = n < 0 ? errno : 0;
  }
  if (n < 0) return rc;
  if (n == 0) return kEof;
  if (static_cast<size_t>(n) != sizeof(CmEvent)) {
    static std::atomic<bool> logged{false};
    if (!logged.exchange(true))
      LogError("dropped a malformed rdma_cm event (%zd bytes) from the router", n);
    return kMalformed;
  }
  std::memcpy(ev, &buf.ev, sizeof(*ev));
  return 0;
}

// Writes one event datagram without waiting: false when the socket has no room for it.
bool SendWhole(int fd, const CmEvent& ev) {
  return ::send(fd, &ev, sizeof(ev), MSG_DONTWAIT | MSG_NOSIGNAL) ==
         static_cast<ssize_t>(sizeof(ev));
}

// Moves pending DEVICE_REMOVAL events into the socket while they fit (removal_mu held).
void FillLocked(CmChannel& ch) {
  while (!ch.pending.empty() && SendWhole(ch.removal_tx.get(), ch.pending.back()))
    ch.pending.pop_back();
}

void TopUp(CmChannel& ch) {
  std::lock_guard<std::mutex> g(ch.removal_mu);
  FillLocked(ch);
}

// Moves the library's own events into the socket while they fit (removal_mu held).
void SendUnsentLocked(CmChannel& ch) {
  size_t sent = 0;
  while (sent < ch.unsent.size() && SendWhole(ch.router_end.get(), ch.unsent[sent])) ++sent;
  ch.unsent.erase(ch.unsent.begin(), ch.unsent.begin() + static_cast<ptrdiff_t>(sent));
  ch.has_unsent.store(!ch.unsent.empty());
}

// After a read made room: the library's held-back events go next.
void SendUnsent(CmChannel& ch) {
  if (!ch.has_unsent.load()) return;
  std::lock_guard<std::mutex> g(ch.removal_mu);
  SendUnsentLocked(ch);
}

// One DEVICE_REMOVAL per live id, last first (they leave `pending` from the back).
std::vector<CmEvent> RemovalEvents(const CmChannel& ch) {
  std::vector<CmLiveId> ids = cmtable::LiveIds(ch);
  std::vector<CmEvent> out(ids.size());
  for (size_t i = 0; i < ids.size(); ++i)
    out[ids.size() - 1 - i] =
        cmtable::OwnEvent(ids[i].uid, ids[i].handle, RDMA_CM_EVENT_DEVICE_REMOVAL);
  return out;
}

// Puts `rx` where the program's descriptor is, with its descriptor flags, unless the
// program closed it meanwhile (the table lock orders this against close).
int Swap(CmChannel& ch, int rx) {
  static std::atomic<int (*)(int, int, int)> real_dup3{nullptr};
  const int fd_flags = ::fcntl(ch.fd, F_GETFD);
  const int fl_flags = ::fcntl(ch.fd, F_GETFL);
  if (fd_flags < 0 || fl_flags < 0) return errno;
  if ((fl_flags & O_NONBLOCK) != 0 && ::fcntl(rx, F_SETFL, O_NONBLOCK) != 0) return errno;
  int rc = 0;
  cmtable::Lock();
  if (!ch.open) {
    rc = EBADF;
  } else if (ff::preload::CallNext(real_dup3, "dup3", rx, ch.fd,
                                   (fd_flags & FD_CLOEXEC) ? O_CLOEXEC : 0) < 0) {
    rc = errno;
  } else {
    cmtable::RenewIdentityLocked(&ch);
  }
  cmtable::Unlock();
  return rc;
}

// DEVICE_REMOVAL for the channel, once (a second reader finds it done).
int Remove(CmChannel& ch) {
  std::lock_guard<std::mutex> g(ch.removal_mu);
  if (ch.removed.load()) return 0;
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair) != 0) return errno;
  UniqueFd rx(pair[0]), tx(pair[1]);
  ch.pending = RemovalEvents(ch);
  const size_t count = ch.pending.size();
  ch.removal_tx = std::move(tx);
  FillLocked(ch);
  if (const int rc = Swap(ch, rx.get())) {
    ch.pending.clear();
    ch.removal_tx.reset();
    return rc;
  }
  ch.removed.store(true);
  LogError("the router closed rdma_cm channel %u: reporting device removal to %zu ids", ch.id,
           count);
  return 0;
}

// GET_EVENT on a channel the program closed meanwhile, as a read of the kernel's device
// does once another thread closed its descriptor: the read holds the file, nothing more
// arrives for it (the close took the channel's ids, and the kernel drops the events of
// destroyed ids), so a blocking read waits until a signal interrupts it (EINTR, also under
// SA_RESTART: a small difference from the kernel) and a non-blocking one finds nothing.
int ClosedWhileReading(int fl) {
  if (fl & O_NONBLOCK) return EAGAIN;
  for (;;) {
    if (::poll(nullptr, 0, -1) < 0 && errno == EINTR) return EINTR;
  }
}

// Copies the event to the program's `response` (at most `out` bytes).
void Deliver(const CmEvent& ev, uint16_t out, uint64_t response) {
  std::memcpy(reinterpret_cast<void*>(static_cast<uintptr_t>(response)), ev.resp,
              std::min<size_t>(out, sizeof(ev.resp)));
}

}  // namespace

void CmQueueEvent(CmChannel& ch, const CmEvent& ev) {
  std::lock_guard<std::mutex> g(ch.removal_mu);
  ch.unsent.push_back(ev);
  SendUnsentLocked(ch);
}

int CmGetEvent(CmChannel& ch, uint16_t out, uint64_t response) {
  if (out < kMinEventOut) return ENOSPC;
  if (response == 0) return EFAULT;
  // The usual case first: a live channel with an event waiting is read without asking how
  // its descriptor waits (one system call fewer). Anything else takes the full path.
  if (cmtable::IsOpen(ch) && !ch.removed.load() && !ch.session->fatal.load()) {
    CmEvent ev;
    const int rc = ReadEvent(ch.fd, Wait::kDontWait, &ev);
    if (rc == 0) SendUnsent(ch);
    if (rc == 0 && cmtable::CountEvent(ch, ev) != CmEventFate::kDrop) {
      Deliver(ev, out, response);
      return 0;
    }
  }
  // How a read of the descriptor waits, for when another thread closes it meanwhile.
  const int fl = ::fcntl(ch.fd, F_GETFL);
  if (fl < 0) return errno;
  for (;;) {
    // Another thread closed the channel while this one read it (rping closes it right after
    // rdma_destroy_id, while its event thread goes back to rdma_get_cm_event): its number
    // is no longer the channel's, and may already name another file.
    if (!cmtable::IsOpen(ch)) return ClosedWhileReading(fl);
    // A session that failed while the channel socket still stands (it should close with
    // the router) still ends here: what is queued first, then DEVICE_REMOVAL.
    const bool gone = !ch.removed.load() && ch.session->fatal.load();
    CmEvent ev;
    const Wait how = gone ? Wait::kDontWait : (fl & O_NONBLOCK) ? Wait::kAsFlags : Wait::kSpinFirst;
    int rc = ReadEvent(ch.fd, how, &ev);
    if ((rc == kEof || rc == EBADF) && !cmtable::IsOpen(ch)) return ClosedWhileReading(fl);
    if (rc == kEof || (gone && rc == EAGAIN)) {
      if (const int removed = Remove(ch)) return removed;
      continue;
    }
    if (rc == kMalformed) continue;
    if (rc != 0) return rc;
    if (ch.removed.load()) TopUp(ch);
    SendUnsent(ch);
    if (cmtable::CountEvent(ch, ev) == CmEventFate::kDrop) continue;
    Deliver(ev, out, response);
    return 0;
  }
}

}  // namespace ff::verbs
