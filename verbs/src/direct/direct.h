// Direct connections (docs/direct-path.md): one TCP connection between this process and a
// process on another node, set up by the two routers, carrying sealed frames of every QP
// pair of the two processes as channels. This layer holds the connections of a session:
// dialling one the router offered, taking one the router accepted for us, the channels
// each carries, and the receiving side of the data path: a record of a channel the peer
// opened is executed here against our own QP and memory (ff::TargetChannel, the same code
// the router runs for relayed channels), with the checks of target_ops.h.
//
// Threads and locks. A connection's two halves are used by different threads: sending
// (send_mu, a leaf lock: nothing is taken while it is held) by whoever posts, receiving
// (recv_mu) by the program's poll (try_lock only, never waiting, with its context lock
// held) or by the event thread (which waits for it, then for the context locks of the QPs
// whose answers it applies). The channel tables have their own leaf lock (chan_mu). Order:
// recv_mu, then a context lock, then send_mu or chan_mu; a thread holding a context lock
// never waits for recv_mu, so no two threads wait for each other.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "base/objects.h"
#include "freeflow/direct_stream.h"
#include "freeflow/target_channel.h"
#include "session/session.h"

namespace ff::verbs {

struct DirectConn;

// A channel the peer opened: its records go to our QP `qpn`, into ring `ring` that the
// router gave the channel (UD: a ring of the channel's own, `ud_ring`). The QP's segment
// (and its SRQ's) are mapped here again, so that records still executing when the QP goes
// away touch memory that stays mapped.
struct InChannel {
  uint32_t chan = 0;
  uint32_t qpn = 0;
  bool datagram = false;  // to a UD QP: its datagrams are never answered
  Mapping seg;
  Mapping ud_ring;
  ff::TargetChannel target;
  ff::NotifySlot* cq_slot = nullptr;  // the QP's receive CQ event word, when it has a channel
  UniqueFd cq_fd;                     // ... and that channel's wake socket (a dup)
  std::deque<std::vector<char>> queue;  // records that could not proceed yet, in order
  uint64_t queued_bytes = 0;
  uint64_t uncredited = 0;  // executed record bytes not credited back yet
  bool waiting = false;     // on the connection's waiting list
  std::atomic<bool> gone{false};  // the router said the channel went: its queue is refused
  // A UD channel the router closed (its sender went, or another took the ring) since then
  // (0: open): what its sender sent before is still delivered, for kUdCloseDrainNs (chan_mu).
  uint64_t closing_since_ns = 0;
};

// A channel we opened for our QP `qp` (its link's): answers and credits come back on it.
// Removed when the link goes (under the QP's context lock), so a `qp` found here while that
// lock is held is alive.
struct OutChannel {
  uint32_t chan = 0;
  Qp* qp = nullptr;
  uint32_t qpn = 0;
  std::atomic<uint64_t> uncredited{0};  // record bytes sent and not credited back
};

// The PeerLink's handle on its channel (PeerLink::direct): removes the channel when the link
// goes.
struct DirectOut {
  std::shared_ptr<DirectConn> conn;
  std::shared_ptr<OutChannel> out;
  // When the current post pass put its first record, the peer owed answers already (a
  // burst is under way): the pass's frames may wait for the next (kDirectOps publish).
  bool owed_at_start = false;
  // UD: when this link last put a record, or when the write after it ended (its burst test,
  // kDirectDatagramBurstNs). 0 for RC and UC.
  uint64_t last_put_ns = 0;
  ~DirectOut();
};

struct DirectConn {
  uint64_t id = 0;
  uint32_t peer_ip = 0;  // host byte order
  Session* session = nullptr;
  // Set once: by the dial, or when the router hands over the accepted socket (kDirectConn).
  // Until then the acceptor's channels wait, and a connection that never comes fails them.
  std::unique_ptr<ff::DirectStream> stream;
  std::atomic<bool> ready{false};
  std::atomic<bool> ended{false};  // dead and reported: no longer in the session's set
  uint64_t created_ns = 0;
  // For the event thread: bytes the socket did not take (flush_due), and when the connection
  // must be served again though nothing arrives (queued records, UINT64_MAX: never).
  std::atomic<bool> flush_due{false};
  std::atomic<uint64_t> due_ns{UINT64_MAX};
  // send_mu: answers held back by the poll, or posts by a burst, since (0: none)
  uint64_t answers_since_ns = 0;
  // The peer owes us `awaiting` answers (one per answered work request whose last record we
  // sent); it last sent a frame, or began to owe from none, at `heard_ns`. Silent for
  // kDirectPeerSilentNs while it owes: it is not reading, and the connection ends.
  std::atomic<uint32_t> awaiting{0};
  std::atomic<uint64_t> heard_ns{0};

  std::mutex send_mu;
  std::mutex recv_mu;
  std::mutex chan_mu;
  std::unordered_map<uint32_t, std::shared_ptr<InChannel>> in;    // chan_mu
  std::unordered_map<uint32_t, std::shared_ptr<OutChannel>> out;  // chan_mu
  // In-channels that went, the newest kDirectGoneChannels, each with whether it went to a
  // UD QP: records the peer sent on one before it heard are refused as a QP that no longer
  // exists refuses them (chan_mu).
  std::unordered_map<uint32_t, bool> gone;
  std::deque<uint32_t> gone_order;
  // When the first UD in-channel that is closing (closing_since_ns set) is due to go
  // (UINT64_MAX: none). Never later than that: a closing channel replaced or forgotten
  // otherwise may leave it early, which costs one look. Written under chan_mu, read by the
  // poll and the event thread to serve an idle connection then (ClosingDue).
  std::atomic<uint64_t> closing_due_ns{UINT64_MAX};

  // Receiving side (recv_mu).
  std::vector<std::shared_ptr<InChannel>> waiting;  // channels with queued records
  uint64_t unknown_since_ns = 0;  // a record for a channel not installed yet waits since
  uint64_t keepalive_ns = 0;      // when we last told the peer its queued records wait
  // The peer closed the connection while datagrams it sent still waited for room in a UD
  // ring here: they are still delivered, for at most kUdCloseDrainNs from then (0: not so).
  uint64_t closed_since_ns = 0;
};

// The direct connections of one session.
struct DirectSet {
  std::mutex mu;  // the map; taken before a connection's locks, never after
  std::unordered_map<uint64_t, std::shared_ptr<DirectConn>> conns;
  // The regions of this session (memory.cc tells of each), mapped on first use for peers'
  // WRITEs, READs and atomics: a second mapping of the region's memfd, as the router and
  // same-node peers map it, so that what they reach is exactly what they could reach
  // through the relay. A leaf lock, like chan_mu.
  struct RegionEntry {
    int fd = -1;  // the region's own memfd (memory.cc owns it; forgotten before it closes)
    size_t size = 0;
    bool writable = false;
    std::shared_ptr<Mapping> map;
  };
  std::mutex region_mu;
  std::unordered_map<uint32_t, RegionEntry> regions;
  // Connections that ended, for the event thread to fail their QPs and tell the router.
  struct Ended {
    std::shared_ptr<DirectConn> conn;
    int error;
    const char* why;  // a static string: the rule the peer broke, or nullptr
  };
  std::vector<Ended> ended;  // mu
};

// ---- the connections (direct_conn.cc) ------------------------------------------------------
// The set of session `s`, made on first use.
DirectSet* DirectOf(Session* s);
// The connections of `s` now (none when it has never had one).
std::vector<std::shared_ptr<DirectConn>> ConnsOf(Session* s);
// The link `link` of `qp` becomes direct, as the router's connect answer `c` says: on the
// connection it names (dialled now when it is new) as channel c.direct_chan. 0 or an errno
// value; a dial that fails still makes the link (dead: its work requests fail as a peer's
// that does not answer) and is reported to the router. Without the context lock.
int LinkDirect(Qp* qp, const ff::proto::ConnectReply& c, PeerLink* link);
// The region `id` of this process mapped for an access needing `need`; nullptr when the
// process has no such region or it was shared for reads only and `need` writes.
std::shared_ptr<Mapping> DirectRegion(Session* s, uint32_t id, uint32_t need);
// Region `id` of session `s` exists (memory.cc): its memfd `fd` of `size` bytes, registered
// for remote writes when `writable`.
void NoteDirectRegion(Session* s, uint32_t id, int fd, size_t size, bool writable);
// The region `id` left the process (memory.cc, before its memfd closes): its mapping goes
// once no access uses it.
void ForgetDirectRegion(Session* s, uint32_t id);
// In-channel `it` of `c` went: it leaves the table, and what still comes for it, or waits on
// its queue, is refused. chan_mu held.
void ForgetChannel(DirectConn* c,
                   std::unordered_map<uint32_t, std::shared_ptr<InChannel>>::iterator it);
// The UD in-channels of `c` that closed kUdCloseDrainNs ago or more go (ForgetChannel), with
// the rings and segments they mapped; closing_due_ns then says when the next one is due.
void ForgetClosedChannels(DirectConn* c, uint64_t now);
// Whether `c` must be served at `now` for a closing channel to go, though nothing arrives.
inline bool ClosingDue(const DirectConn* c, uint64_t now) {
  return c->closing_due_ns.load(std::memory_order_relaxed) <= now;
}
// Lowers the due time `at` to `due` (a later one leaves it), whoever else lowers it too.
inline void LowerDue(std::atomic<uint64_t>& at, uint64_t due) {
  uint64_t cur = at.load(std::memory_order_relaxed);
  while (due < cur && !at.compare_exchange_weak(cur, due, std::memory_order_relaxed)) {
  }
}
// A connection died: it leaves the session's set (the next connect between the two
// processes makes a new one), its descriptor leaves the event sets, and the router hears
// DirectEnded. `why` (a static string, or nullptr): the rule the peer broke, for the log.
// Idempotent.
void EndConn(DirectConn* c, int error, const char* why = nullptr);
// Wakes this process's poll if it sleeps on its wake word (kWakeSlot).
void WakeSelf(Session* s);

// ---- the receiving side (datapath/link_direct.cc) ------------------------------------------
// Receives what connection `c` holds and handles each frame: records of the peer's channels
// executed, answers applied to our QPs' send queues, credits taken. `held`: the context
// whose lock the caller holds (the program's poll, which takes no other context's lock and
// never waits for the connection), or nullptr (the event thread, which waits for locks).
// Returns when the socket is empty, or a frame must wait (its channel not installed yet,
// its QP's context busy). The earliest time it must be served again though nothing
// arrives (UINT64_MAX: none) goes to *due. `now`: the caller's clock, read just before (0:
// read here).
void ServeConn(DirectConn* c, Context* held, uint64_t* due, uint64_t now = 0);
// Poll path: serves the readable connections of the session of `ctx`. ctx->lock held.
void DrainDirect(Context* ctx);

}  // namespace ff::verbs
