// poll_cq, completion events and the sleep on the router's wake word (see completion.h).
//
// Polling drives the whole data path: it advances queued sends of the context (send
// queue), then turns records of the CQ's receive QPs into completions (receive path).
// Polling programs make no system call per message. A poll that finds nothing sleeps only
// on a CQ whose every source of completions is fed by the router (MaySleepOnRouter): the
// router rings the process wake word after each delivery, so the sleep costs no latency,
// and the routers get the CPU a spinning benchmark would take from them.
#include "datapath/completion.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>

#include "base/exports.h"
#include "datapath/link.h"
#include "datapath/recv_path.h"
#include "datapath/send_queue.h"
#include "direct/direct.h"
#include "freeflow/clock.h"
#include "session/peer_events.h"
#include "session/session.h"

namespace ff::verbs {
namespace {

// Advances queued sends and turns published ring records into completions of `cq`.
void Collect(Context* ctx, Cq* cq) {
  DrainDirect(ctx);
  if (!ctx->pending.empty()) ProgressPending(ctx);
  for (Qp* qp : cq->recv_qps) Drain(qp);
}

// Moves completions into the caller's array after the `k` already there.
int PopWcs(Cq* cq, int n, ibv_wc* wc, int k) {
  while (k < n && cq->head != cq->tail) {
    wc[k++] = cq->wcs[cq->head & cq->mask];
    ++cq->head;
  }
  return k;
}

// This thread stops polling the direct connections (it is about to sleep): the event
// thread serves them from now on, not once the attention window closed.
void LeaveDirect(Session* s) {
  if (s->direct_conns.load(std::memory_order_relaxed) == 0) return;
  FlushDirectAnswers(s);
  if (s->direct_polled_ns.load(std::memory_order_relaxed) == 0) return;
  s->direct_polled_ns.store(0, std::memory_order_relaxed);
  ff::SendWake(s->tick_tx.get());
}

// `idle`: the CQ has been empty for kYieldAfterEmptyNs; then a direct connection, whose
// socket wakes the sleeper itself (WaitForRouter), counts as a source that may be slept on.
bool RouterFed(const Qp* qp, bool idle) {
  const PeerLink* link = qp->conn.link.get();
  return !qp->kind->datagram && link != nullptr &&
         (link->ops->router_fed || (idle && link->ops->wakes_sleeper));
}

// True when at least one source of completions on `cq` is fed by the router (an RC/UC
// receive QP linked through it, or a queued send on such a link) and no other source
// exists: a UD receive QP (any sender may deliver), a receive QP linked to a process of
// this node, or a queued send of the context that is not on a router link (it advances
// only while someone polls). Derived from the links that exist, every time.
bool MaySleepOnRouter(const Context* ctx, const Cq* cq, bool idle = false) {
  bool router_source = false;
  for (const Qp* qp : cq->recv_qps) {
    if (qp->kind->datagram) return false;
    if (qp->conn.link == nullptr) {
      // Awaiting its peer's consent: that peer may already deliver, from anywhere.
      if (qp->conn.awaited.waiting) return false;
      continue;  // not connected: delivers nothing
    }
    if (!RouterFed(qp, idle)) return false;
    router_source = true;
  }
  for (const Qp* qp : ctx->pending) {
    if (!RouterFed(qp, idle)) return false;
    router_source = router_source || qp->scq == cq;
  }
  return router_source;
}

// Sleeps until the router rings the process wake word (armed by the caller), at most
// FFV_REMOTE_WAIT_US (default kDefaultRemoteWaitUs; 0: only yield the CPU). Called without
// the context lock.
void WaitForRouter(Session* s) {
  static const long wait_us = [] {
    const char* v = std::getenv("FFV_REMOTE_WAIT_US");
    return v != nullptr ? std::atol(v) : static_cast<long>(ff::kDefaultRemoteWaitUs);
  }();
  if (wait_us <= 0 || !s->wake_fd) {
    sched_yield();
    return;
  }
  // Direct connections wake this thread themselves, as a blocking recv would: it serves them
  // when it wakes. The event thread keeps away for its attention window (kDirectAttendNs)
  // only; a sleep longer than that may see it wake for the same data.
  const bool direct = s->direct_conns.load(std::memory_order_relaxed) > 0;
  if (direct) s->direct_polled_ns.store(ff::MonotonicNs(), std::memory_order_relaxed);
  pollfd p[2] = {{s->wake_fd.get(), POLLIN, 0}, {s->direct_ep.get(), POLLIN, 0}};
  const timespec ts{wait_us / 1000000, (wait_us % 1000000) * 1000};
  if (::ppoll(p, direct ? 2 : 1, &ts, nullptr) > 0 && p[0].revents != 0)
    ff::DrainWakes(s->wake_fd.get());
}

// The empty-poll path of a router-fed CQ: arm the wake word, look once more (no lost
// wake-up), sleep, look again. Returns the completions found. ctx->lock held on entry and
// exit; released while asleep.
int SleepOnRouter(Context* ctx, Cq* cq, int n, ibv_wc* wc) {
  ff::NotifySlot* wake = ctx->session->slot(ff::proto::kWakeSlot);
  wake->armed.exchange(1, std::memory_order_seq_cst);
  Collect(ctx, cq);
  if (cq->head == cq->tail) {
    FlushDirectAnswers(ctx->session);
    ctx->lock.unlock();
    WaitForRouter(ctx->session);
    ctx->lock.lock();
    Collect(ctx, cq);
  }
  wake->armed.store(0, std::memory_order_relaxed);
  return PopWcs(cq, n, wc, 0);
}

// The CQ of `channel` whose event fired, or nullptr. Also advances queued sends, which
// nobody else advances while the application sleeps. ctx->lock held.
Cq* TakeFiredCq(Channel* ch, bool* pending) {
  Context* ctx = ch->ctx;
  // The oldest event first: a program waiting on the receive CQ right after an event of
  // its send CQ (perftest's and qperf's event loops do) must see them in that order.
  Cq* found = nullptr;
  uint64_t oldest = UINT64_MAX;
  for (Cq* cq : ch->cqs) {
    const uint64_t when = EventSlot(cq)->fired.load(std::memory_order_acquire);
    if (when != 0 && when < oldest) {
      oldest = when;
      found = cq;
    }
  }
  if (found != nullptr) EventSlot(found)->fired.store(0, std::memory_order_relaxed);
  if (ctx->attention.load(std::memory_order_relaxed)) HandleAttention(ctx);
  ProgressPending(ctx);
  *pending = !ctx->pending.empty();
  return found;
}

// Waits for the channel's wake socket as a read of a real channel does: until it is
// written (EAGAIN at once when it is non-blocking; EINTR when a signal interrupts it and the
// handler does not ask for restarts). While sends are queued it waits at most *retry_ns,
// then returns 0 so that they are retried, doubling *retry_ns up to kPendingSendRetryNs:
// a peer that frees room is noticed within microseconds, a stalled one costs few wake-ups.
// 0, or a positive errno.
int WaitForEvent(ibv_comp_channel* channel, bool pending, uint64_t* retry_ns) {
  const bool nonblocking = (::fcntl(channel->fd, F_GETFL) & O_NONBLOCK) != 0;
  if (!pending) {
    // A blocking wait polls a while first (SpinForAnswer): on one node the event usually
    // follows within microseconds, and waking a sleeping thread costs more. The wake-up
    // itself is taken below; the fired words tell which CQ.
    if (!nonblocking) {
      SpinForAnswer(ProcessRingControl(), [&] {
        char b;
        return ::recv(channel->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) < 0 ? errno : 0;
      });
    }
    return ff::WaitForWakes(channel->fd);
  }
  const timespec retry{0, static_cast<long>(*retry_ns)};
  const timespec zero{0, 0};
  *retry_ns = std::min(*retry_ns * 2, ff::kPendingSendRetryNs);
  pollfd p{channel->fd, POLLIN, 0};
  const int r = ::ppoll(&p, 1, nonblocking ? &zero : &retry, nullptr);
  if (r < 0) return errno;
  if (r > 0) {
    ff::DrainWakes(channel->fd);
    return 0;
  }
  return nonblocking ? EAGAIN : 0;
}

int GetCqEvent(ibv_comp_channel* channel, ibv_cq** cq_out, void** cq_context) {
  Channel* ch = ToChannel(channel);
  uint64_t retry_ns = ff::kPendingSendFirstRetryNs;
  for (;;) {
    bool pending = false;
    Cq* found;
    {
      std::lock_guard<AdaptiveLock> l(ch->ctx->lock);
      found = TakeFiredCq(ch, &pending);
    }
    if (found != nullptr) {
      *cq_out = &found->cq;
      if (cq_context != nullptr) *cq_context = found->cq.cq_context;
      return 0;
    }
    LeaveDirect(ch->ctx->session);
    if (const int rc = WaitForEvent(channel, pending, &retry_ns)) return rc;
  }
}

}  // namespace

void OnCqOverflow(Cq* cq) {
  if (cq->overflowed) return;
  cq->overflowed = true;
  if (cq->ignore_overrun) {  // the program asked not to hear of it
    LogDebug("completion queue overflow (%u entries), ignored as asked", cq->capacity);
    return;
  }
  LogError("completion queue overflow (%u entries); completions are being lost", cq->capacity);
  PushAsyncEvent(cq->ctx, IBV_EVENT_CQ_ERR, &cq->cq);
}

void FireCq(Cq* cq) {
  if (cq->notify_slot == ff::proto::kNoId || cq->channel == nullptr) return;
  // Always written, even by the thread that will wait: a program may watch the channel's
  // descriptor with poll or epoll instead of blocking in ibv_get_cq_event.
  ff::FireSlot(EventSlot(cq), cq->channel->tx.get());
}

void FireIfArmed(Cq* cq) {
  if (cq->notify_slot != ff::proto::kNoId && ff::TakeArm(EventSlot(cq), true, true)) FireCq(cq);
}

void NudgeCq(Cq* cq) {
  if (cq->channel != nullptr) ff::SendWake(cq->channel->tx.get());
}

namespace {

// Traffic flows on `cq`: its next empty poll spins again, and its streak of empty polls
// starts anew.
void EndEmptyStreak(Cq* cq) {
  cq->empty_polls = 0;
  cq->empty_since_ns = 0;
  cq->idle_sleeps = false;
}

// poll_cq's body (ctx->lock held), shared with the extended CQ's start_poll and next_poll.
// `may_sleep`: an empty poll of a router-fed CQ may wait for the router (see SleepOnRouter).
// `yield` (ibv_poll_cq only): set when another CQ has been empty for kYieldAfterEmptyNs, for
// the caller to give the CPU away once it released the lock (tunables.h says why).
__attribute__((always_inline)) inline int PollBody(Context* ctx, Cq* cq, int n, ibv_wc* wc,
                                                   bool may_sleep, bool* yield = nullptr) {
  const int rc = Guarded([&] {
    if (ctx->attention.load(std::memory_order_relaxed)) HandleAttention(ctx);
    DrainDirect(ctx);
    if (!ctx->pending.empty()) ProgressPending(ctx);
    if (cq->tail - cq->head < static_cast<uint64_t>(n)) {
      for (Qp* qp : cq->recv_qps) Drain(qp);
    }
    return 0;
  });
  int k = PopWcs(cq, n, wc, 0);
  if (k == 0) WarmNextRecv(ctx);
  if (__builtin_expect(k == 0, 0) && may_sleep && rc == 0) {
    if (MaySleepOnRouter(ctx, cq)) {
      Guarded([&] { return (k = SleepOnRouter(ctx, cq, n, wc)), 0; });
    } else if (cq->idle_sleeps && MaySleepOnRouter(ctx, cq, true)) {
      const uint64_t slept = ff::MonotonicNs();
      Guarded([&] { return (k = SleepOnRouter(ctx, cq, n, wc)), 0; });
      // A completion soon after the sleep began: the peer is busy again (a ping-pong, a
      // stream after a pause), and a sleep per message would cost it a thread wake-up each
      // (UCX's tag_lat across nodes: 38 us against 7 spinning). The next empty poll spins.
      if (k > 0 && ff::MonotonicNs() - slept < ff::kBusyAgainNs) EndEmptyStreak(cq);
    } else if (yield != nullptr && ++cq->empty_polls >= ff::kEmptyPollsPerCheck) {
      cq->empty_polls = 0;
      const uint64_t now = ff::MonotonicNs();
      if (cq->empty_since_ns == 0) {
        cq->empty_since_ns = now;
      } else if (now - cq->empty_since_ns >= ff::kYieldAfterEmptyNs) {
        // Long empty and fed only over sockets that wake a sleeper (direct connections) or
        // by the router: sleep as a router-fed CQ does, instead of spinning on a peer that
        // has gone quiet. A latency loop's answer comes long before this.
        if (MaySleepOnRouter(ctx, cq, true)) {
          cq->idle_sleeps = true;
          Guarded([&] { return (k = SleepOnRouter(ctx, cq, n, wc)), 0; });
        } else {
          ++cq->yields;
          *yield = true;
        }
      }
    }
  } else if (k > 0) {
    // Found without sleeping: traffic flows, the next empty poll spins again. One found by
    // a sleep leaves the streak as it was: a quiet peer that sent one message stays quiet.
    EndEmptyStreak(cq);
  }
  return rc != 0 && k == 0 ? -rc : k;
}

}  // namespace

int PollLocked(Cq* cq, int n, ibv_wc* wc, bool may_sleep) {
  return PollBody(cq->ctx, cq, n, wc, may_sleep);
}

int PollCq(ibv_cq* ibcq, int n, ibv_wc* wc) {
  Cq* cq = ToCq(ibcq);
  Context* ctx = cq->ctx;
  if (n <= 0) return 0;
  bool yield = false;
  int k;
  {
    std::lock_guard<AdaptiveLock> l(ctx->lock);
    k = PollBody(ctx, cq, n, wc, true, &yield);
  }
  if (__builtin_expect(yield, 0)) sched_yield();
  return k;
}

// Arms for the next completion, or (solicited_only) the next solicited one or error. A CQ
// already armed for any completion stays so. Full barriers: the caller polls next.
int ReqNotifyCq(ibv_cq* ibcq, int solicited_only) {
  Cq* cq = ToCq(ibcq);
  if (cq->notify_slot == ff::proto::kNoId) return 0;
  std::atomic<uint32_t>& armed = EventSlot(cq)->armed;
  if (!solicited_only) {
    armed.exchange(ff::kArmedAny, std::memory_order_seq_cst);
  } else {
    uint32_t idle = 0;
    armed.compare_exchange_strong(idle, ff::kArmedSolicited, std::memory_order_seq_cst);
  }
  return 0;
}

}  // namespace ff::verbs

using namespace ff::verbs;

extern "C" FFV_EXPORT int ibv_get_cq_event(ibv_comp_channel* channel, ibv_cq** cq_out,
                                           void** cq_context) {
  if (channel == nullptr || cq_out == nullptr) return ZeroOrMinusOne(EINVAL);
  return ZeroOrMinusOne(Guarded([&] { return GetCqEvent(channel, cq_out, cq_context); }));
}
