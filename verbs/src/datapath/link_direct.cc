// Links to a peer on another node over a direct connection (kDirectOps), and the receiving
// side of those connections (docs/direct-path.md, "Inside the library").
//
// Sending: a work request becomes the records the relay would carry (link_router.cc), each
// sealed as one frame of the link's channel into the connection's send buffer; the buffer is
// written at the end of the pass (publish). Per channel at most kChannelWindow record bytes
// are not yet credited back by the target; beyond that, or with the send buffer full, the
// WQE waits as on a full ring, and the event thread advances it (a stalled send queue).
//
// Receiving: whichever comes first serves a connection, the program's poll (DrainDirect:
// a polling receiver sees a message without a thread wake-up) or the event thread. Records of
// the peer's channels are executed against our QP by ff::TargetChannel, the same code as the
// router's executor; answers come back to our send queues as the router's responses do.
#include <poll.h>
#include <sys/epoll.h>

#include <algorithm>

#include "datapath/link.h"
#include "datapath/send_queue.h"
#include "datapath/sge.h"
#include "direct/direct.h"

namespace ff::verbs {
namespace {

using ff::direct::Type;

// ---- sending ---------------------------------------------------------------------------------

enum class PutResult { kOk, kWait, kDead };

// One request record of `w` as a frame: its headers, then `data_len` bytes of the WQE's data
// from `data_off`, gathered straight from the application's buffers into the seal.
PutResult PutRecord(Qp* qp, PeerLink* link, const SendWqe& w, uint64_t index, uint8_t kind,
                    uint8_t flags, const ff::ProxyRequest& op, uint64_t data_off,
                    uint32_t data_len) {
  DirectOut& d = *link->direct;
  DirectConn* c = d.conn.get();
  if (!c->ready.load(std::memory_order_acquire)) {
    // Our end of a connection the router accepted for us has not been handed over yet.
    return ff::MonotonicNs() - c->created_ns > ff::kDirectAcceptTimeoutNs + ff::kDirectDialTimeoutNs
               ? PutResult::kDead
               : PutResult::kWait;
  }
  ff::RecordHeader h = MessageHeader(qp, w, kind, flags);
  h.frag_len = static_cast<uint32_t>(sizeof(op)) + data_len;
  h.total = ff::RecordBytes(h.frag_len);
  const uint64_t bytes = sizeof(h) + h.frag_len;
  if (d.out->uncredited.load(std::memory_order_relaxed) + bytes > ff::kChannelWindow)
    return PutResult::kWait;
  if (!link->dirty) {
    if (qp->kind->answered) {
      d.owed_at_start = c->awaiting.load(std::memory_order_relaxed) > 0;
    } else {
      const uint64_t now = ff::MonotonicNs();
      d.owed_at_start = now - d.last_put_ns < ff::kDirectDatagramBurstNs;
      d.last_put_ns = now;
    }
  }
  iovec v[2 + ff::kMaxSge];
  v[0] = {&h, sizeof(h)};
  v[1] = {const_cast<ff::ProxyRequest*>(&op), sizeof(op)};
  int n = 2;
  WalkSges(qp->sq.sges_of(index), w.num_sge, data_off, data_len, [&](char* p, uint64_t take) {
    if (n < static_cast<int>(std::size(v))) v[n++] = {p, static_cast<size_t>(take)};
  });
  ff::DirectStream::Put put;
  {
    std::lock_guard<std::mutex> g(c->send_mu);
    put = c->stream->PutFrame(Type::kRecord, d.out->chan, 0, v, n);
  }
  if (put == ff::DirectStream::Put::kFull) return PutResult::kWait;
  if (put == ff::DirectStream::Put::kDead) return PutResult::kDead;
  d.out->uncredited.fetch_add(bytes, std::memory_order_relaxed);
  // The work request's last record: the peer owes it one answer (RC).
  if (op.last && qp->kind->answered &&
      c->awaiting.fetch_add(1, std::memory_order_relaxed) == 0)
    c->heard_ns.store(ff::MonotonicNs(), std::memory_order_relaxed);
  link->dirty = true;
  return PutResult::kOk;
}

// What a PutResult means for the WQE: kBlocked to retry it, or done with a transport error
// (a datagram is lost, as on a fabric, and the QP's next one to that destination asks for a
// new link: UdLink).
Exec NotPut(Qp* qp, PeerLink* link, PutResult r, ibv_wc_status* st) {
  if (r == PutResult::kWait) return Exec::kBlocked;
  link->dead = true;
  if (qp->kind->datagram) {
    *st = IBV_WC_SUCCESS;
    return Exec::kDone;
  }
  *st = IBV_WC_RETRY_EXC_ERR;
  HoldPeerError(qp);
  return Exec::kDone;
}

Exec SendRecords(Qp* qp, PeerLink* link, SendWqe& w, uint64_t index, ibv_wc_status* st) {
  ff::ProxyRequest op = RequestOf(qp, w, index);
  const uint32_t max_frag = qp->kind->max_fragment;
  while (w.sent < w.length || !w.started) {
    const auto frag = static_cast<uint32_t>(std::min<uint64_t>(w.length - w.sent, max_frag));
    const bool last = w.sent + frag == w.length;
    op.last = last ? 1 : 0;
    const PutResult r = PutRecord(qp, link, w, index, ff::kRecSend,
                                  SendFlags(w, !w.started, last), op, w.sent, frag);
    if (r != PutResult::kOk) return NotPut(qp, link, r, st);
    w.sent += frag;
    w.started = true;
  }
  return qp->kind->answered ? Exec::kInFlight : Exec::kDone;
}

Exec WriteRecords(Qp* qp, PeerLink* link, SendWqe& w, uint64_t index, ibv_wc_status* st) {
  ff::ProxyRequest op = RequestOf(qp, w, index);
  const bool with_imm = w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
  while (w.sent < w.length || !w.started) {
    const auto frag = static_cast<uint32_t>(std::min<uint64_t>(w.length - w.sent, ff::kMaxFragment));
    op.remote_addr = w.remote_addr + w.sent;
    op.last = !with_imm && w.sent + frag == w.length ? 1 : 0;
    const PutResult r = PutRecord(qp, link, w, index, ff::kRecWrite, 0, op, w.sent, frag);
    if (r != PutResult::kOk) return NotPut(qp, link, r, st);
    w.sent += frag;
    w.started = true;
  }
  if (!with_imm) return Exec::kInFlight;
  op.remote_addr = w.remote_addr;
  op.last = 1;
  const PutResult r = PutRecord(qp, link, w, index, ff::kRecWriteImm, WriteImmFlags(w), op, 0, 0);
  return r == PutResult::kOk ? Exec::kInFlight : NotPut(qp, link, r, st);
}

Exec ReadOrAtomicRecord(Qp* qp, PeerLink* link, SendWqe& w, uint64_t index, ibv_wc_status* st) {
  // As an HCA does: at most max_rd_atomic READs/atomics outstanding per QP (an ATOMIC_WRITE
  // is not one of them: it goes as a WRITE does).
  const bool counted = IsReadOrAtomic(w.opcode);
  if (counted && qp->sq.reads_inflight >= std::max<uint32_t>(1, qp->attr.max_rd_atomic))
    return Exec::kBlocked;
  ff::ProxyRequest op = RequestOf(qp, w, index);
  op.last = 1;
  const uint8_t kind = w.opcode == IBV_WR_RDMA_READ ? ff::kRecReadReq : ff::kRecAtomicReq;
  const PutResult r = PutRecord(qp, link, w, index, kind, 0, op, 0, 0);
  if (r != PutResult::kOk) return NotPut(qp, link, r, st);
  if (counted) ++qp->sq.reads_inflight;
  return Exec::kInFlight;
}

constexpr OpHandlers kHandlers = {SendRecords, WriteRecords, ReadOrAtomicRecord,
                                  ReadOrAtomicRecord};

Exec ExecuteDirect(Qp* qp, PeerLink* link, SendWqe& w, uint64_t index, ibv_wc_status* st) {
  if (link->direct->conn->ended.load(std::memory_order_acquire))
    return NotPut(qp, link, PutResult::kDead, st);
  return Dispatch(kHandlers, qp, link, w, index, st);
}

// Writes what the pass put into the connection's send buffer. What the socket does not take
// now is written by the next pass, or by the event thread (the connection is due).
void FlushConn(DirectConn* c) {
  if (!c->ready.load(std::memory_order_acquire)) return;
  bool left;
  {
    std::lock_guard<std::mutex> g(c->send_mu);
    c->stream->Flush();
    c->answers_since_ns = 0;
    left = c->stream->unsent() > 0;
  }
  if (left && !c->flush_due.exchange(true)) ff::SendWake(c->session->tick_tx.get());
}

// Whether the frames a post pass put may wait instead of being written now. Posts into a
// burst (answers owed from earlier ones, so more posts or a poll come soon) of a program that
// attends its connections wait, as answers do, for the next pass or poll to write them with
// its own: ib_send_bw's small messages cost a system call and a segment each otherwise. The
// first post after a quiet spell (a ping-pong's, a latency loop's) always goes at once. At
// most kDirectHeldAnswerBytes wait, for at most kDirectAnswerDelayNs; a program that stops
// calling in has them written by the event thread, which looks when its attention window
// ends (flush_due). `now`: the pass's clock.
bool HoldPosts(DirectConn* c, uint64_t now) {
  const uint64_t polled = c->session->direct_polled_ns.load(std::memory_order_relaxed);
  if (polled == 0 || now - polled >= ff::kDirectAttendNs) return false;
  std::lock_guard<std::mutex> g(c->send_mu);
  if (c->stream->unsent() >= ff::kDirectHeldAnswerBytes) return false;
  if (c->answers_since_ns == 0) {
    c->answers_since_ns = now;
  } else if (now - c->answers_since_ns >= ff::kDirectAnswerDelayNs) {
    return false;
  }
  c->flush_due.store(true, std::memory_order_relaxed);
  return true;
}

void PublishDirect(PeerLink* link) {
  DirectOut& d = *link->direct;
  DirectConn* c = d.conn.get();
  if (!c->ready.load(std::memory_order_acquire)) return;
  // A program that polls its connections and is now posting attends them as much: it polls
  // again once its send queue is full at the latest. The event thread keeps away from them
  // while it does, as while it polls. Counted from the last poll alone, a burst of posts that
  // took longer than the attention window (128 of ib_send_bw's on a host whose system calls
  // were slow) had the event thread take the answers meanwhile, the two threads contending
  // for the connection and its locks, and posts no longer held for one write: ib_send_bw's
  // 64-byte rate fell to a fifth and stayed there. A program asleep in the library (0) is
  // not woken into attention by a post (nor one that just went to sleep on another thread:
  // the exchange fails then).
  const uint64_t now = ff::MonotonicNs();
  std::atomic<uint64_t>& polled = c->session->direct_polled_ns;
  uint64_t last = polled.load(std::memory_order_relaxed);
  if (last != 0) polled.compare_exchange_strong(last, now, std::memory_order_relaxed);
  if (d.owed_at_start && HoldPosts(c, now)) return;
  FlushConn(c);
  // UD's burst test measures the program's gap between posts: the write just made (through
  // both TCP stacks, longer than kDirectDatagramBurstNs on a slow host) does not count. Timed
  // from the post, a stream of datagrams that was once written one at a time stayed so: each
  // write made the next post late (bench/RESULTS.md, "UD's burst test").
  if (d.last_put_ns != 0) d.last_put_ns = ff::MonotonicNs();
}

void CollectDirect(Qp* qp, PeerLink* link) {
  DirectConn* c = link->direct->conn.get();
  uint64_t due;
  ServeConn(c, qp->ctx, &due);
  // The connection ended: what is in flight is never answered. As a requester whose peer
  // stopped answering, the WQEs fail once the QP's retries would have run out.
  if (c->ended.load(std::memory_order_acquire) && qp->sq.inflight > 0) {
    FailInFlight(qp, link);
    HoldPeerError(qp);
  }
}

// Room is made by the peer's credits and the socket, which the poll and the event thread
// take in; nobody nudges. A WQE that waits stalls, and the event thread advances it.
bool AwaitRoom(PeerLink*, Room) { return false; }

// ---- receiving -------------------------------------------------------------------------------

// What a target owes its initiator, put with the answers' reserve (DirectStream::Priority):
// one response record of work request `seq` of channel `chan`, with `len` bytes of `data`
// (READ and atomic data) at `offset`; or a credit of `bytes` (0: a keepalive). false when
// even the reserve is full: the peer does not read what it is owed.
bool PutResponse(DirectConn* c, uint32_t chan, uint32_t seq, uint32_t status, uint64_t offset,
                 const char* data, uint32_t len, bool last) {
  const ff::ProxyResponse r{offset, seq, static_cast<uint16_t>(status),
                            static_cast<uint8_t>(last ? 1 : 0), 0};
  const ff::RecordHeader h = ff::ResponseHeader(len);
  const iovec v[3] = {{const_cast<ff::RecordHeader*>(&h), sizeof(h)},
                      {const_cast<ff::ProxyResponse*>(&r), sizeof(r)},
                      {const_cast<char*>(data), len}};
  std::lock_guard<std::mutex> g(c->send_mu);
  return c->stream->PutFrame(Type::kResp, chan, 0, v, len > 0 ? 3 : 2,
                             ff::DirectStream::Priority::kAnswer) == ff::DirectStream::Put::kOk;
}

bool PutCredit(DirectConn* c, uint32_t chan, uint64_t bytes) {
  const ff::direct::Credit credit{bytes};
  const iovec v{const_cast<ff::direct::Credit*>(&credit), sizeof(credit)};
  std::lock_guard<std::mutex> g(c->send_mu);
  return c->stream->PutFrame(Type::kCredit, chan, 0, &v, 1, ff::DirectStream::Priority::kAnswer) ==
         ff::DirectStream::Put::kOk;
}

// Where the TargetChannel of one InChannel sends its answers and finds our memory.
struct Host {
  DirectConn* c;
  InChannel* ch;
  std::vector<std::shared_ptr<Mapping>>* regions;  // held until the serve ends
  bool overflow = false;

  void Respond(uint32_t seq, uint32_t status, uint64_t offset, const char* data, uint32_t len,
               bool last) {
    if (!PutResponse(c, ch->chan, seq, status, offset, data, len, last)) overflow = true;
  }
  bool CanAnswer() {
    std::lock_guard<std::mutex> g(c->send_mu);
    return c->stream->HasRoom(ff::DirectStream::kFrameMax);
  }
  const ff::MrEntry* MrTable() { return c->session->mr_table.as<ff::MrEntry>(); }
  const Mapping* MapRegion(uint32_t region, uint32_t need) {
    std::shared_ptr<Mapping> m = DirectRegion(c->session, region, need);
    if (!m) return nullptr;
    regions->push_back(m);
    return m.get();
  }
};

// One serve of one connection: what it has locked, touched and found.
struct Serve {
  DirectConn* c;
  Context* held;             // the caller's context (poll), or nullptr (event thread)
  Context* locked = nullptr;  // the event thread's one other context lock, or the poll's try
  std::vector<Qp*> touched;  // QPs of `locked` that answers came for (event thread)
  std::vector<std::shared_ptr<Mapping>> regions;
  uint64_t now = 0;
  uint64_t due = UINT64_MAX;
  bool kill = false;
  int error = EPROTO;  // what the connection ends with when killed
  const char* why = nullptr;

  void Kill(const char* reason, int err = EPROTO) {
    if (!kill) error = err;
    kill = true;
    if (why == nullptr) why = reason;
  }
  // The QPs answers came for go on (completions, sends waiting for credits), then the lock
  // is given back.
  void Release() {
    if (locked == nullptr) return;
    for (Qp* qp : touched)
      if (qp->sq.in_pending_list) Progress(qp);
    touched.clear();
    locked->lock.unlock();
    locked = nullptr;
  }
  // Holds the lock of `ctx`: the poll's own, or one more taken without waiting (poll) or
  // waited for (event thread, one at a time).
  bool Lock(Context* ctx) {
    if (ctx == held || ctx == locked) return true;
    if (held != nullptr) {
      if (locked != nullptr || !ctx->lock.try_lock()) return false;
      locked = ctx;
      return true;
    }
    Release();
    ctx->lock.lock_urgent();
    locked = ctx;
    return true;
  }
};

void CreditBack(Serve& sv, InChannel* ch, uint64_t bytes) {
  ch->uncredited += bytes;
  if (ch->uncredited < ff::kCreditBatch) return;
  const uint64_t owed = ch->uncredited;
  ch->uncredited = 0;
  if (!PutCredit(sv.c, ch->chan, owed)) sv.Kill("the peer does not read what it is owed");
}

// Publishes what `ch` put into our QP's ring and wakes whoever waits for it.
void PublishIn(Serve& sv, InChannel* ch) {
  bool solicited = false;
  if (!ch->target.Publish(&solicited)) return;
  if (ch->cq_slot != nullptr) ff::WakeIfArmed(ch->cq_slot, ch->cq_fd.get(), solicited);
  WakeSelf(sv.c->session);
}

// A record frame's body as a request: false when it is not a well-formed one.
bool DecodeRecord(const char* body, size_t len, ff::RequestView* v) {
  ff::RecordHeader h;
  const char* payload = nullptr;
  return ff::SplitRecord(body, len, &h, &payload) && ff::DecodeRequest(h, payload, v);
}

// Runs the queued records of `ch`, oldest first. true when none is left.
bool RunQueue(Serve& sv, InChannel* ch) {
  Host host{sv.c, ch, &sv.regions};
  uint64_t done = 0;
  while (!ch->queue.empty()) {
    const std::vector<char>& rec = ch->queue.front();
    ff::RequestView v;
    DecodeRecord(rec.data(), rec.size(), &v);  // checked when it arrived; in our memory since
    if (!ch->target.Apply(host, v)) break;
    done += rec.size();
    ch->queued_bytes -= rec.size();
    ch->queue.pop_front();
  }
  if (host.overflow) sv.Kill("the peer does not read what it is owed");
  PublishIn(sv, ch);
  if (done != 0) CreditBack(sv, ch, done);
  return ch->queue.empty();
}

// A record of a channel whose QP went (the peer sent it before it heard): refused as a QP
// that no longer exists refuses, the work request failing with retries exceeded (a datagram
// is lost, unanswered), and its bytes credited back so that the peer's window does not
// shrink. The record was checked.
void Refuse(Serve& sv, uint32_t chan, bool datagram, const ff::RequestView& v, uint32_t len) {
  if ((v.req.last && !datagram &&
       !PutResponse(sv.c, chan, v.req.seq, IBV_WC_RETRY_EXC_ERR, 0, nullptr, 0, true)) ||
      !PutCredit(sv.c, chan, len))
    sv.Kill("the peer does not read what it is owed");
}

// Refuses what waited on a channel that went since.
void RefuseQueue(Serve& sv, InChannel* ch) {
  while (!ch->queue.empty() && !sv.kill) {
    const std::vector<char>& rec = ch->queue.front();
    ff::RequestView v;
    DecodeRecord(rec.data(), rec.size(), &v);  // checked when it arrived
    Refuse(sv, ch->chan, ch->datagram, v, static_cast<uint32_t>(rec.size()));
    ch->queued_bytes -= rec.size();
    ch->queue.pop_front();
  }
}

bool OnRecord(Serve& sv, uint32_t chan, const char* body, uint32_t len) {
  DirectConn* c = sv.c;
  ff::RequestView v;
  if (!DecodeRecord(body, len, &v)) {
    sv.Kill("the peer sent a malformed record");
    return false;
  }
  std::shared_ptr<InChannel> ch;
  bool gone = false, datagram = false;
  {
    std::lock_guard<std::mutex> g(c->chan_mu);
    auto it = c->in.find(chan);
    if (it != c->in.end()) {
      ch = it->second;
    } else if (auto went = c->gone.find(chan); went != c->gone.end()) {
      gone = true;
      datagram = went->second;
    }
  }
  if (gone) {
    Refuse(sv, chan, datagram, v, len);
    return !sv.kill;
  }
  if (!ch) {
    // The router announces a channel before its initiator may use it, but our event thread
    // may not have taken that in yet (it waits for a lock, or the CPU): the wait counts only
    // while no event is left to take (a 20-rank UD alltoall on two vCPUs fell 2 s behind).
    if (c->unknown_since_ns == 0 || EventsPending(c->session)) c->unknown_since_ns = sv.now;
    if (sv.now - c->unknown_since_ns > ff::kDirectChannelWaitNs) {
      sv.Kill("the peer sent records on a channel nobody opened");
    } else {
      sv.due = std::min(sv.due, sv.now + ff::kDirectRetryNs);
    }
    return false;
  }
  c->unknown_since_ns = 0;
  if (ch->queue.empty()) {
    Host host{c, ch.get(), &sv.regions};
    const bool applied = ch->target.Apply(host, v);
    if (host.overflow) sv.Kill("the peer does not read what it is owed");
    if (applied) {
      PublishIn(sv, ch.get());
      CreditBack(sv, ch.get(), len);
      return !sv.kill;
    }
  }
  // It waits, and so does everything behind it on this channel. The initiator keeps within
  // the window; one that does not loses the connection.
  if (ch->queued_bytes + len > 2 * ff::kChannelWindow) {
    sv.Kill("the peer overran a channel's window");
    return false;
  }
  ch->queue.emplace_back(body, body + len);
  ch->queued_bytes += len;
  if (!ch->waiting) {
    ch->waiting = true;
    c->waiting.push_back(ch);
  }
  return true;
}

// The out-channel `chan` and its QP, with the QP's context locked; nullptr when the channel
// is gone or its context cannot be locked now (*busy).
std::shared_ptr<OutChannel> LockedOut(Serve& sv, uint32_t chan, bool* busy) {
  *busy = false;
  auto find = [&]() -> std::shared_ptr<OutChannel> {
    std::lock_guard<std::mutex> g(sv.c->chan_mu);
    auto it = sv.c->out.find(chan);
    return it == sv.c->out.end() ? nullptr : it->second;
  };
  std::shared_ptr<OutChannel> o = find();
  if (!o) return nullptr;
  if (!sv.Lock(o->qp->ctx)) {
    *busy = true;
    return nullptr;
  }
  // The link may have gone while we waited for its context: then so has the channel.
  return find() == o ? o : nullptr;
}

bool OnResponse(Serve& sv, uint32_t chan, const char* body, uint32_t len) {
  ff::RecordHeader h;
  const char* payload = nullptr;
  ff::ResponseView v;
  if (!ff::SplitRecord(body, len, &h, &payload) || !ff::DecodeResponse(h, payload, &v)) {
    sv.Kill("the peer sent a malformed answer");
    return false;
  }
  bool busy = false;
  std::shared_ptr<OutChannel> o = LockedOut(sv, chan, &busy);
  if (busy) return false;  // handed out again later: counted then
  if (v.resp.last) {
    // One answer fewer owed (never below none, whatever a peer sends).
    uint32_t owed = sv.c->awaiting.load(std::memory_order_relaxed);
    while (owed > 0 && !sv.c->awaiting.compare_exchange_weak(owed, owed - 1,
                                                            std::memory_order_relaxed)) {
    }
  }
  if (!o) return true;  // for a QP that is gone: nobody waits for it
  ApplyProxyResponse(o->qp, v, false);
  if (sv.held == nullptr &&
      std::find(sv.touched.begin(), sv.touched.end(), o->qp) == sv.touched.end())
    sv.touched.push_back(o->qp);
  return true;
}

bool OnCredit(Serve& sv, uint32_t chan, const char* body, uint32_t len) {
  ff::direct::Credit credit;
  if (len != sizeof(credit)) {
    sv.Kill("the peer sent a malformed credit");
    return false;
  }
  std::memcpy(&credit, body, sizeof(credit));
  if (credit.bytes == 0) return true;  // a keepalive: the peer holds records it cannot run yet
  bool busy = false;
  std::shared_ptr<OutChannel> o = LockedOut(sv, chan, &busy);
  if (busy) return false;
  if (!o) return true;
  uint64_t cur = o->uncredited.load(std::memory_order_relaxed);
  if (credit.bytes > cur) {
    sv.Kill("the peer credited bytes it was never sent");
    return false;
  }
  o->uncredited.store(cur - credit.bytes, std::memory_order_relaxed);
  if (sv.held == nullptr &&
      std::find(sv.touched.begin(), sv.touched.end(), o->qp) == sv.touched.end())
    sv.touched.push_back(o->qp);
  return true;
}

bool OnFrame(Serve& sv, const ff::direct::Head& h, char* body) {
  switch (h.type) {
    case Type::kRecord:
      return OnRecord(sv, h.chan, body, h.len);
    case Type::kResp:
      return OnResponse(sv, h.chan, body, h.len);
    case Type::kCredit:
      return OnCredit(sv, h.chan, body, h.len);
    default:
      sv.Kill("the peer sent a second hello");
      return false;
  }
}

// The peer closed `c` in order while datagrams it sent wait here for room in their UD ring
// (the receiver's program has not taken the earlier ones yet): they arrived, as on a fabric
// they would have reached the receiving HCA, so they are still delivered, as the relay does
// (Executor::CloseSender), for at most kUdCloseDrainNs; the connection ends after that, or
// once none waits. What waits for an RC receive goes with the connection. recv_mu held.
bool DrainsDatagrams(DirectConn* c, uint64_t now) {
  if (!c->stream->dead() || c->stream->violated()) return false;
  const bool waits =
      std::any_of(c->waiting.begin(), c->waiting.end(), [](const std::shared_ptr<InChannel>& ch) {
        return ch->datagram && !ch->queue.empty() && !ch->gone.load();
      });
  if (!waits) return false;
  if (c->closed_since_ns == 0) {
    c->closed_since_ns = now;
    // A closed socket is always readable: from now on only the due times bring us back.
    ::epoll_ctl(c->session->direct_ep.get(), EPOLL_CTL_DEL, c->stream->fd(), nullptr);
  }
  return now - c->closed_since_ns < ff::kUdCloseDrainNs;
}

// Up to this many connections, the poll receives on each rather than asking epoll first.
constexpr uint32_t kDirectProbeConns = 2;

// When `c` must be served again though nothing arrives, for both the poll and the event
// thread.
void NoteDue(DirectConn* c, uint64_t due) {
  c->due_ns.store(due, std::memory_order_relaxed);
  LowerDue(c->session->direct_due_ns, due);
}

}  // namespace

void ServeConn(DirectConn* c, Context* held, uint64_t* due, uint64_t now) {
  *due = UINT64_MAX;
  if (now == 0) now = ff::MonotonicNs();
  // A closed UD channel goes once drained, whether the connection works (yet) or not.
  ForgetClosedChannels(c, now);
  if (!c->ready.load(std::memory_order_acquire) || c->ended.load(std::memory_order_acquire))
    return;
  std::unique_lock<std::mutex> recv(c->recv_mu, std::defer_lock);
  if (held != nullptr) {
    if (!recv.try_lock()) return;
  } else {
    recv.lock();
  }
  Serve sv{c, held};
  sv.now = held != nullptr ? now : ff::MonotonicNs();  // the event thread may have waited
  // First what waited (RNR, a full ring, READ data for a full connection), in order.
  std::erase_if(c->waiting, [&](const std::shared_ptr<InChannel>& ch) {
    if (ch->gone.load(std::memory_order_acquire)) RefuseQueue(sv, ch.get());
    if (sv.kill || !RunQueue(sv, ch.get())) return false;
    ch->waiting = false;
    return true;
  });
  int frames = 0;
  for (int reads = 0; reads < ff::kDirectReadsPerServe && !sv.kill; ++reads) {
    bool stopped = false;
    const int n = c->stream->Receive([&](const ff::direct::Head& h, char* body) {
      if (sv.kill || !OnFrame(sv, h, body)) {
        stopped = true;
        return false;
      }
      return true;
    });
    if (n > 0) frames += n;
    // A short receive emptied the socket: another would find nothing now; the next poll or
    // the event thread's readiness looks again.
    if (n <= 0 || stopped || c->stream->drained()) break;
  }
  sv.Release();
  if (frames > 0) c->heard_ns.store(sv.now, std::memory_order_relaxed);
  if (!c->waiting.empty() && sv.now - c->keepalive_ns >= ff::kDirectKeepaliveNs && !sv.kill) {
    // Records wait here (RNR): tell the peer, whose answers are late, that we are alive.
    c->keepalive_ns = sv.now;
    if (!PutCredit(c, c->waiting.front()->chan, 0)) sv.Kill("the peer does not read what it is owed");
  }
  uint64_t silent_due = UINT64_MAX;
  if (c->awaiting.load(std::memory_order_relaxed) > 0 && !sv.kill) {
    // Answers are owed: a peer silent for kDirectPeerSilentNs since stopped reading or
    // executing, as a peer HCA that stops acknowledging. Its deadline is kept apart from
    // sv.due: the event thread looks at owed answers every kDirectKeepaliveNs anyway, so
    // it never needs waking for one.
    const uint64_t heard = c->heard_ns.load(std::memory_order_relaxed);
    if (heard < sv.now && sv.now - heard > ff::kDirectPeerSilentNs) {
      sv.Kill("the peer has not answered for 2 s", ETIMEDOUT);
    } else {
      silent_due = heard + ff::kDirectPeerSilentNs + 1;
    }
  }
  {
    // The program's poll holds its answers back a little: the program usually posts next
    // (a reply, the next request), and one write then carries both (a ping-pong's
    // acknowledgement cost a system call and a segment each way). The event thread, or
    // answers held long enough, go now.
    std::lock_guard<std::mutex> g(c->send_mu);
    const size_t unsent = c->stream->unsent();
    if (held != nullptr && unsent > 0 && unsent < ff::kDirectHeldAnswerBytes &&
        (c->answers_since_ns == 0 || sv.now - c->answers_since_ns < ff::kDirectAnswerDelayNs)) {
      if (c->answers_since_ns == 0) c->answers_since_ns = sv.now;
      sv.due = std::min(sv.due, c->answers_since_ns + ff::kDirectAnswerDelayNs);
    } else if (unsent > 0) {
      c->stream->Flush();
      c->answers_since_ns = 0;
      if (c->stream->unsent() > 0) sv.due = std::min(sv.due, sv.now + ff::kDirectRetryNs);
    }
  }
  // Records that wait (mostly for a receive the program has not posted yet) are looked at
  // again by the program's next poll, which may just have posted it, or by the event thread
  // a little later; their RNR budget is counted by TargetChannel either way.
  if (!c->waiting.empty()) sv.due = std::min(sv.due, sv.now + (held != nullptr ? 0 : ff::kDirectRetryNs));
  const bool draining = !sv.kill && DrainsDatagrams(c, sv.now);
  recv.unlock();
  if (!draining && (sv.kill || c->stream->dead())) {
    EndConn(c, sv.kill ? sv.error : c->stream->violated() ? EPROTO : ECONNRESET, sv.why);
    return;
  }
  *due = std::min({sv.due, silent_due, c->closing_due_ns.load(std::memory_order_relaxed)});
  NoteDue(c, *due);
  // The event thread reads due times only when it wakes: at the end of the program's
  // attention window, or on an event. A serve of the poll can outlast that window (a large
  // message, a preempted thread), and the event thread may then have looked already, found
  // nothing due and gone to sleep with no deadline; an answer held back now would never go.
  // So a poll that leaves something due once the window has closed wakes it.
  if (held != nullptr && sv.due != UINT64_MAX) {
    const uint64_t polled = c->session->direct_polled_ns.load(std::memory_order_relaxed);
    if (polled == 0 || ff::MonotonicNs() - polled >= ff::kDirectAttendNs)
      ff::SendWake(c->session->tick_tx.get());
  }
}

void FlushDirectAnswers(Session* s) {
  for (const auto& c : ConnsOf(s)) FlushConn(c.get());
}

void DrainDirect(Context* ctx) {
  Session* s = ctx->session;
  const uint32_t nconns = s->direct_conns.load(std::memory_order_relaxed);
  if (nconns == 0) return;
  const uint64_t now = ff::MonotonicNs();
  const uint64_t before = s->direct_polled_ns.exchange(now, std::memory_order_relaxed);
  // The program takes its connections back: the event thread, which may wait for them with
  // no deadline, learns to look again once this attention lapses (what the poll holds back
  // may be due then).
  if (before == 0 || now - before >= ff::kDirectAttendNs) ff::SendWake(s->tick_tx.get());
  DirectSet* set = DirectOf(s);
  // Reused by every poll of this thread (no allocation a poll); emptied after each, so that
  // it holds no connection between polls.
  static thread_local std::vector<std::shared_ptr<DirectConn>> serve;
  const bool due = s->direct_due_ns.load(std::memory_order_relaxed) <= now;
  epoll_event evs[8];
  int n = 0;
  if (nconns <= kDirectProbeConns) {
    // A few connections: a receive on each costs no more than asking epoll which are
    // readable, and one system call less when one is.
    if (due) s->direct_due_ns.store(UINT64_MAX, std::memory_order_relaxed);
    std::lock_guard<std::mutex> g(set->mu);
    for (auto& [id, c] : set->conns) serve.push_back(c);
  } else {
    n = ::epoll_wait(s->direct_ep.get(), evs, 8, 0);
    if (n <= 0 && !due) return;
  }
  {
    std::lock_guard<std::mutex> g(set->mu);
    for (int i = 0; i < n; ++i) {
      auto it = set->conns.find(evs[i].data.u64);
      if (it != set->conns.end()) serve.push_back(it->second);
    }
    if (due && nconns > kDirectProbeConns) {
      // Queued records or unsent bytes of some connection: the earliest is due.
      s->direct_due_ns.store(UINT64_MAX, std::memory_order_relaxed);
      for (auto& [id, c] : set->conns)
        if (c->due_ns.load(std::memory_order_relaxed) <= now || c->flush_due.load() ||
            ClosingDue(c.get(), now))
          serve.push_back(c);
    }
  }
  for (const auto& c : serve) {
    c->flush_due.store(false, std::memory_order_relaxed);
    uint64_t when;
    ServeConn(c.get(), ctx, &when, now);
  }
  serve.clear();
}

uint64_t ServeDirectEvents(Session* s) {
  FinishEndedDirect(s);
  std::vector<std::shared_ptr<DirectConn>> conns;
  DirectSet* set = DirectOf(s);
  epoll_event evs[16];
  const int n = ::epoll_wait(s->direct_ep.get(), evs, 16, 0);
  const uint64_t now = ff::MonotonicNs();
  {
    std::lock_guard<std::mutex> g(set->mu);
    for (auto& [id, c] : set->conns) {
      bool readable = false;
      for (int i = 0; i < n && !readable; ++i) readable = evs[i].data.u64 == id;
      const uint64_t when = c->due_ns.load(std::memory_order_relaxed);
      // Owed answers not looked at since the program posted: their deadline is set there.
      const bool owed = when == UINT64_MAX && c->awaiting.load(std::memory_order_relaxed) > 0;
      if (readable || when <= now || owed || c->flush_due.load(std::memory_order_relaxed) ||
          ClosingDue(c.get(), now))
        conns.push_back(c);
    }
  }
  for (const auto& c : conns) {
    c->flush_due.store(false, std::memory_order_relaxed);
    uint64_t due;
    ServeConn(c.get(), nullptr, &due);
  }
  uint64_t next = UINT64_MAX;
  {
    std::lock_guard<std::mutex> g(set->mu);
    for (auto& [id, c] : set->conns)
      next = std::min({next, c->due_ns.load(std::memory_order_relaxed),
                       c->closing_due_ns.load(std::memory_order_relaxed)});
    // A post does not wake this thread (that would cost every message a system call): it
    // looks every kDirectKeepaliveNs for answers owed since, to time a silent peer out.
    if (!set->conns.empty()) next = std::min(next, now + ff::kDirectKeepaliveNs);
  }
  FinishEndedDirect(s);
  return next;
}

// Not router-fed: an empty poll does not sleep on the wake word. Nobody needs the CPU a
// polling program keeps (there is no router in the path), and waking from that sleep for
// every message doubled ib_send_lat's latency and cost ib_write_bw 40% of its bandwidth. A
// program that waits in ibv_get_cq_event, or stops polling, leaves its connections to the
// event thread.
const LinkOps kDirectOps = {ExecuteDirect, CollectDirect, CollectDirect,
                            false,         true,          false,
                            AwaitRoom,     PublishDirect, ff::TrafficPlacement::kDirect};

}  // namespace ff::verbs
