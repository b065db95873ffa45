// A session: one connection of this process to a router, and what the router handed over at
// HELLO. The process-wide device (ibv_get_device_list, ibv_open_device) uses one session,
// found through FREEFLOW_DIR / FFR_NAME; tests open more with OpenSession to run several
// "pods" in one process, each against its own router.
//
// Threading: Call() and Post() serialise requests (one in flight per session) and own the
// request ring. The event thread reads
// `events` and `tick_rx` only and reports through the registry (peer_events.h), which also
// has it advance stalled sends. Everything else is written before the session is published
// and read-only afterwards.
#pragma once

#include <infiniband/verbs.h>
#include <sched.h>

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/objects.h"
#include "freeflow/clock.h"
#include "freeflow/ipv4.h"
#include "freeflow/ring.h"
#include "session/peer_events.h"

namespace ff::verbs {

// The ibv_device of a session (standard layout: ibv_device* <-> Device*). `index` is
// ibv_get_device_index: each process-wide session after a lost one gets the next, as a
// device the kernel registers again does, so that whoever cached the old device by its
// GUID and index (librdmacm) looks for it again instead of reusing the dead one.
struct Device {
  ibv_device dev;
  Session* session;
  int index = 0;
};

// The library's end of a session's request ring (proto::RequestRing), once the router took
// it: requests are written there instead of sent, which costs the router no system call to
// receive when it is awake, and the library none to send. Its memfd is closed once the
// router has its copy (the mapping is all the library needs).
struct RequestRingEnd {
  Mapping map;
  ff::RingProducer producer;
  ff::RequestRingControl* control = nullptr;  // nullptr: requests go on the socket
};

struct DirectSet;

struct Session {
  UniqueFd sock;       // requests (with descriptors, or all without a ring) and answers
  UniqueFd events;     // router -> library notifications; the event thread's alone
  std::mutex call_mu;  // one request in flight at a time; guards `ring` and `seq`
  RequestRingEnd ring;
  uint32_t seq = 0;
  std::string name;  // the router's socket path, or the name given to OpenSession (logs)
  // From HELLO.
  uint32_t ctx_id = 0;
  uint32_t ip = 0;  // host byte order
  uint16_t lid = 0;
  ff::Ipv4Prefix overlay;  // the pod network: a peer's LID is its address's offset in it
  std::string node;
  // Our NotifySlot array: CQ event words, then the wake word (kWakeSlot). Its memfd went to
  // the router at HELLO and is closed here.
  Mapping notify;
  UniqueFd wake_fd;  // wake socket (fd.h), rung by the router after it delivered to us
  UniqueFd wake_tx;  // its sending end, until HELLO hands it to the router
  // A wake socket of this process alone (no other process ever holds either end): the data
  // path rings tick_tx when a context's sends stall (Context::stalled); the event thread
  // sleeps on tick_rx beside `events` and then ticks until none is stalled.
  UniqueFd tick_rx, tick_tx;
  Mapping mr_table;
  // Where links count the work requests they carry out (nullptr: nowhere), handed to the
  // router at open (proto::TrafficLedger).
  std::shared_ptr<TrafficLedger> traffic;
  std::atomic<bool> fatal{false};  // the router is gone
  // What the rdma_cm layer does when the router is lost (rdmacm/cm_device.cc sets it when the
  // session's first channel opens): the event thread runs it after failing every QP.
  std::atomic<void (*)(Session*)> on_router_lost{nullptr};
  std::atomic<bool> closing{false};  // CloseSession is shutting the sockets down
  // The event thread is taking an event off `events` (receiving or handling it): what the
  // router told is not in force yet (EventsPending).
  std::atomic<bool> taking_event{false};
  std::thread event_thread;
  Registry registry;
  Device device{};
  // Notify slots of CQs with a completion channel (objects.cc).
  std::mutex slot_mu;
  std::vector<uint32_t> free_slots;
  uint32_t next_slot = 0;
  // Ids of channels, CQs, SRQs and PDs. The router keeps them per session (one namespace for
  // every context of the process), so they come from here, never from a context: two contexts
  // numbering from 1 each collided (EEXIST from ibv_create_cq / ibv_create_comp_channel).
  std::atomic<uint32_t> next_id{1};

  // One synchronous request. Returns 0, a positive errno from the router, or a local one
  // (ENOTCONN: router gone, ETIMEDOUT: no answer within kRouterCallTimeoutS, EPROTO: a
  // malformed answer). Received descriptors go to fds_out (at most max_fds_out).
  int Call(const void* req, size_t len, const int* fds, int nfds, ff::proto::Response* resp,
           UniqueFd* fds_out = nullptr, int max_fds_out = 0, int* nfds_out = nullptr);
  // A request without descriptors whose answer carries nothing the caller needs.
  int SimpleCall(const void* req, size_t len);
  // A request sent without waiting: the router answers none (seq kPostedSeq) and only logs
  // its failure, so only for requests whose outcome the library already knows. Requests
  // are handled in the order sent, posted or not. 0, or ENOTCONN when the router is gone.
  // With `served_at`, also where its record ends in the request ring (0 without a ring):
  // Served() tells when the router has done it.
  int Post(const void* req, size_t len, const int* fds = nullptr, int nfds = 0,
           uint64_t* served_at = nullptr);
  // True once the router has served every request up to `served_at` (a Post position).
  bool Served(uint64_t served_at);

  // Spare QP segments (qp.cc, verbs-library.md "Spare QP segments"): segments of destroyed
  // RC/UC QPs that never left this process, kept mapped for its next QP of the same size,
  // oldest first, at most ff::kSpareQpSegments.
  struct SpareSegment {
    UniqueFd fd;
    Mapping map;
    uint64_t served_at = 0;  // its QP's destroy, in the request ring
  };
  std::mutex spare_mu;
  std::deque<SpareSegment> spare_segments;

  // QP numbers the router granted for posted RC/UC creates (proto::CreateQpReply), and the
  // lock that keeps taking one and posting its create in the order the router sees them
  // against an answered create, whose answer replaces the list.
  std::mutex qpn_mu;
  std::vector<uint32_t> qpn_grants;

  // Direct connections to processes on other nodes (direct/direct.h): their set, made on
  // first use (direct_mu); one epoll set of their sockets that the program's poll and the
  // event thread both wait on; how many are being served; when the program last polled them
  // or posted to one of them after a poll (0: it sleeps, the event thread serves them); and
  // our own wake word's sending end (a dup of the one the router holds), which wakes a poll
  // asleep on the wake word.
  std::mutex direct_mu;
  std::shared_ptr<DirectSet> direct;
  std::atomic<bool> has_direct{false};
  UniqueFd direct_ep;
  std::atomic<uint32_t> direct_conns{0};
  std::atomic<uint64_t> direct_polled_ns{0};
  std::atomic<uint64_t> direct_due_ns{UINT64_MAX};  // the earliest connection's due time
  UniqueFd self_wake_tx;
  // Serializes connects from their request to their link (connect.cc): a connect answered
  // with an existing direct connection finds it made, even when a connect of another
  // thread just made it.
  std::mutex connect_mu;

  ff::NotifySlot* slot(uint32_t index) const { return notify.as<ff::NotifySlot>() + index; }
};

// The process-wide session, connected on first use to FREEFLOW_DIR/FFR_NAME.sock; nullptr
// while the router cannot be reached (the next call tries again). `on_open`, when the call
// connects it, runs once with the new session before any other thread can see it (the
// device layer serves the device nodes from then on); it is kept for later sessions.
// A session whose router was lost (`fatal`) is replaced by a new one when the router is
// back: the old one stays (its contexts keep failing with ENOTCONN until they are closed)
// and is never freed. A connect that finds the router being replaced waits for it
// (kDefaultRouterWaitMs, FFV_ROUTER_WAIT_MS) once per outage.
Session* GetSession(void (*on_open)(Session*) = nullptr);
// The process-wide session if it is connected, without trying to connect (it may be one
// whose router was lost).
Session* ProcessSession();
// The process-wide session if it is connected and its router alive, replacing a lost one
// as GetSession does, or opening the first one of a child forked from a process that had
// one; nullptr when there is none (and neither this process nor the one it was forked from
// had one, when `*had` is false).
Session* LiveProcessSession(bool* had);

// fork support (fork.cc): the process-wide session's lock, held across fork(), and the
// child's side: it drops the parent's session (closing its descriptors in the child) so
// that its first verb connects a session of its own. Child side: no other thread runs.
void LockProcessSession();
void UnlockProcessSession();
void ForgetProcessSessionInChild();

// How long a thread that would block in the library (on the router, an rdma_cm channel or a
// completion channel) polls before it sleeps: FFV_SPIN_US, default
// ff::kDefaultAnswerSpinUs; 0 sleeps at once.
uint64_t AnswerSpinNs();

// The process-wide session's request ring control block, when it has a ring (else nullptr):
// it tells where its router runs (RouterOnThisCpu).
const ff::RequestRingControl* ProcessRingControl();

// Whether the router of `control` (nullptr: not known) last ran on this thread's CPU. A
// spin there waits for an answer that the spin itself holds back: on two CPUs shared by a
// router and two pods, spinning beside the router halved the rdma_cm connection rate.
inline bool RouterOnThisCpu(const ff::RequestRingControl* control) {
  if (control == nullptr) return false;
  const uint32_t router = control->router_cpu.load(std::memory_order_relaxed);
  return router != 0 && router == static_cast<uint32_t>(::sched_getcpu() + 1);
}

// Repeats `attempt` (a non-blocking try: EAGAIN while nothing is there) until it returns
// something else, AnswerSpinNs() has passed or the router (of `control`) shows it runs on
// this CPU. Returns its last result; EAGAIN tells the caller to sleep (a blocking wait).
template <typename Attempt>
int SpinForAnswer(const ff::RequestRingControl* control, Attempt&& attempt) {
  const uint64_t spin = AnswerSpinNs();
  if (spin == 0) return EAGAIN;
  const uint64_t until = ff::MonotonicNs() + spin;
  int rc;
  do {
    rc = attempt();
  } while (rc == EAGAIN && !RouterOnThisCpu(control) && ff::MonotonicNs() < until);
  return rc;
}

// Whether the router told this process something it has not taken in yet: an event waits on
// the event socket, or the event thread is handling one. A record on a direct channel that
// is not installed waits while this holds (link_direct.cc).
bool EventsPending(Session* s);

// ---- direct connections: served by the layers above, for the event thread ----------------
// The router's events about direct connections (kDirectChannel, kDirectChannelGone,
// kDirectConn with its socket). direct/direct_conn.cc.
void OnDirectEvent(Session* s, const ff::proto::Event& e, UniqueFd fd);
// Serves the direct connections that are readable or due, and finishes those that ended;
// returns when to serve them again though nothing arrives (UINT64_MAX: when something
// does). datapath/link_direct.cc.
uint64_t ServeDirectEvents(Session* s);
// Fails the QPs of direct connections that ended and tells the router. direct_conn.cc.
void FinishEndedDirect(Session* s);
// fork's child: closes its copies of the parent's direct connections. direct_conn.cc.
void CloseDirectInChild(Session* s);
// Writes what the program's polls and posts held back on every direct connection of `s`
// (its thread goes to sleep, or turns to the router). datapath/link_direct.cc.
void FlushDirectAnswers(Session* s);

// ---- internal API for tests (not exported from libffverbs.so) -----------------------------
// Connects to the router listening at `socket_path` (HELLO, event thread), independently of
// the process-wide session. nullptr and a positive errno in *error on failure.
Session* OpenSession(const std::string& socket_path, int* error);
// The same over an already connected SOCK_SEQPACKET socket (e.g. one end of a socketpair);
// `name_for_logs` names the router in messages. Takes the socket in every case.
Session* OpenSession(ff::UniqueFd connected_socket, const std::string& name_for_logs, int* error);
// A verbs context on `s`, exactly as ibv_open_device gives for the process-wide device:
// nullptr with errno set on failure. Close it with ibv_close_device.
ibv_context* OpenContext(Session* s);
// For a session whose contexts are all closed (and their memory deregistered): shuts its
// sockets down, joins its event thread and frees it. Never for the process-wide session.
//
// Limit: registered memory is tracked per process by address (memory.cc). Two sessions of
// one process must not register overlapping pages: a registration that overlaps memory
// registered through another session fails with EINVAL.
void CloseSession(Session* s);

}  // namespace ff::verbs
