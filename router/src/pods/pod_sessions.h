// Pod sessions: the router's Unix socket, one connection per pod process, and who is on the
// other end. The session layer identifies each client through the kernel (IdentityResolver),
// reads its requests, checks each against the protocol table (proto::DecodeRequest: size,
// op and descriptor count) and hands it to the request handler; it sends answers and event
// notifications back. It knows nothing of QPs or memory.
//
// Answers: every request gets exactly one, through Answer(), now or later (a cross-node
// connect is answered when the peer router replies). Requests of one pod are read one
// after another; a pod that does not wait for its answers has at most its kPending quota
// of requests unanswered (later ones get EAGAIN).
//
// Quotas: each identified connection opens a ledger (Quotas::Open) that the session's
// requests charge; a pod over its session quota is refused at HELLO with EMFILE. Refused
// clients are kept (at most kMaxRefusedSessions) only until they read why, and every client
// that does not say HELLO within kHelloTimeoutNs is dropped.
// New connections to the socket are identified by the gate (pods/pod_gate.h), on a thread
// of its own, and handed to this loop identified or with the reason they are refused.
// Threading: the loop's thread only.
#pragma once

#include <cerrno>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/event_loop.h"
#include "base/quotas.h"
#include "freeflow/fd.h"
#include "freeflow/protocol.h"
#include "freeflow/ring.h"
#include "identity/identity.h"
#include "objects/resources.h"
#include "pods/event_backlog.h"
#include "pods/pod_gate.h"
#include "pods/traffic_claims.h"

namespace ff::router {

class HandoverState;

// A request being answered.
struct Call {
  PodId pod = 0;
  proto::Op op = proto::Op::kHello;
  uint32_t seq = 0;
};

class PodSessions : private EventLoop::Poller {
 public:
  class Handler {
   public:
    virtual ~Handler() = default;
    // A request that passed the protocol table. It must be answered through Answer(), now
    // or later. Returns false when it breaks the protocol: the pod is then disconnected.
    virtual bool OnRequest(const Call& call, const char* msg, UniqueFd* fds, int nfds) = 0;
    // The pod's connection closed or was dropped.
    virtual void OnPodGone(PodId pod) = 0;
  };

  PodSessions(EventLoop& loop, IdentityResolver& identity, Quotas& quotas, Handler& handler)
      : loop_(loop), identity_(identity), quotas_(quotas), handler_(handler) {
    loop_.AddPoller(this);
  }
  ~PodSessions() override;

  // Listens on `bound`, a Unix socket already bound where pods find it; its gate takes and
  // identifies new connections. false + *error.
  bool Listen(UniqueFd bound, std::string* error);
  // Serves an already-connected client socket (a test's socketpair end), identified on
  // this thread.
  void Adopt(UniqueFd sock);

  // Who is on the other end of `pod` (nullptr when it is gone).
  const PodIdentity* Identity(PodId pod) const;
  // What a session speaks after its HELLO: verbs (kHello) or TCP mode (kSockHello, then only
  // proto::IsSocketOp requests). A request of the other kind is a protocol violation.
  enum class Kind : uint8_t { kVerbs, kSocket };
  // Completes a successful HELLO: later requests of `kind` are accepted and events go to
  // `events` (none for socket sessions).
  void Welcome(PodId pod, UniqueFd events, Kind kind = Kind::kVerbs);
  // The connected socket of `pod` (-1 when it is gone), for asking the kernel about the
  // process behind it; never read or written but by the session layer.
  int SocketOf(PodId pod) const;
  // Sends the answer to `call`: status 0 or a positive errno value, `body` the reply union.
  // A pod that cannot take its answer is disconnected (after the current turn).
  void Answer(const Call& call, int status, const proto::Response& body, const int* fds = nullptr,
              int nfds = 0);
  void Answer(const Call& call, int status) { Answer(call, status, proto::Response{}); }
  // Sends an event. While the pod's event socket is full, events wait (EventBacklog: an
  // event replaces the queued one it makes stale), charged to the pod's queued-bytes and
  // descriptor quotas; a pod that lets more wait than those allow (or kMaxQueuedEvents)
  // does not read them, and loses its event socket.
  void Notify(PodId pod, proto::EventType type, uint32_t qpn);
  // Sends `e` with descriptor `fd` (kUdRing, kDirectConn).
  void NotifyWithFd(PodId pod, const proto::Event& e, int fd);
  // Events waiting for pods' full event sockets, and how many were replaced by newer ones.
  size_t events_waiting() const;
  uint64_t events_replaced() const { return events_replaced_; }
  void NotifyAll(proto::EventType type);
  // Disconnects `pod` now (OnPodGone runs before this returns).
  void Drop(PodId pod, const char* why);
  // On the router's timer: drops clients that did not say HELLO in time.
  void Sweep();
  void set_hello_timeout(uint64_t ns) { hello_timeout_ns_ = ns; }
  // After a request, the loop polls this long (EventLoop::StayAwake; 0: it sleeps at once).
  void set_answer_spin(uint64_t ns) { answer_spin_ns_ = ns; }
  size_t count() const { return sessions_.size(); }
  // Refused connections kept until their HELLO reads the reason; and every refusal since
  // the router started (identity, address, session quota).
  size_t refused() const { return refused_; }
  uint64_t refusals() const { return refusals_; }
  // Where refusals are noted for an admin (ffctl events); nullptr: nowhere. Not owned.
  void set_event_log(EventLog* log) { events_ = log; }
  // Answers with an error since start, by (op, errno); sessions ended, by the reason Drop
  // was given (a fixed sentence: the keys are bounded). For metrics.
  const std::map<std::pair<uint32_t, int>, uint64_t>& errors() const { return errors_; }
  const std::map<std::string, uint64_t>& ends() const { return ends_; }
  // The gate: connections waiting to be identified, and whether it stopped accepting for
  // lack of descriptors.
  size_t unidentified() const { return gate_ != nullptr ? gate_->waiting() : 0; }
  bool accept_paused() const { return gate_ != nullptr && gate_->accept_paused(); }
  // Where what sessions' traffic ledgers gained goes (nullptr: nowhere; not owned). Each
  // ledger is read by ReadTraffic (a scrape) and once more when its session ends.
  void set_traffic_sink(TrafficSink* sink) { traffic_sink_ = sink; }
  void ReadTraffic();
  // Hand-over (docs/handover.md, pods/handover.cc): every session that is not refused, with
  // its sockets, ring, ledger and waiting events, into state.doc["sessions"]; and back into a
  // PodSessions that has none, each watched as a new one is; a session whose address is
  // outside `overlay` (this router's pod network) is refused. Stop() first: the gate closes
  // (connections it has not identified yet close; their libraries connect again).
  void StopGate() { gate_.reset(); }
  // After StopGate, when the hand-over failed: the gate takes connections again.
  bool RestartGate(std::string* error);
  int listening_fd() const { return listen_.get(); }
  void Export(HandoverState& state);
  void Import(HandoverState& state, const Ipv4Prefix& overlay);
  // Sessions whose library handed over a traffic ledger; what the reads refused, by reason.
  size_t ledgers() const;
  const ClaimRefusals& claim_refusals() const { return claim_refusals_; }

 private:
  struct Session {
    PodId id = 0;
    UniqueFd sock;
    EventLoop::WatchId watch = 0;
    UniqueFd events;
    EventBacklog backlog;  // events waiting for room on `events`
    EventLoop::WatchId events_watch = 0;  // while some wait: for room
    uint64_t charged_event_bytes = 0;     // what the backlog holds against the pod's quotas
    uint64_t charged_event_fds = 0;
    PodIdentity who;
    bool welcomed = false;
    Kind kind = Kind::kVerbs;
    std::string refusal;  // why the client is not served (no overlay address, ...)
    int refusal_error = EACCES;
    // Its request ring (proto::RequestRing), once handed over: requests are read there.
    Mapping ring_map;
    RingConsumer ring;
    RequestRingControl* ring_control = nullptr;
    TrafficClaims traffic;  // its traffic ledger (proto::TrafficLedger), once handed over
  };
  // Queues `e` (and `fd`) for `s`, charged to its quotas; false when they or the backlog
  // are full.
  bool QueueEvent(Session& s, const proto::Event& e, int fd);
  void OnEventsWritable(PodId id);
  // Makes what `s` is charged for its waiting events what they hold now (gives back).
  void SettleEventCharges(Session& s);
  // The pod does not read its events (or its event socket broke): it loses the socket.
  void LoseEvents(Session& s, const std::string& why);
  // EventLoop::Poller: the request rings.
  void Poll() override;
  void ShowCpu();
  bool Arm() override;
  void Disarm() override;
  // proto::RequestRing: maps and checks the ring; the answer's status.
  int TakeRing(Session& s, const proto::RequestRing& m, UniqueFd* fds, int nfds);
  // The record at the head of a ring, as read once: checked, then used as it was read.
  struct Head {
    RecordHeader hdr{};
    const char* payload = nullptr;  // in the pod's memory
    uint64_t at = 0;                // its publish time
  };
  // kOk with *head filled; kEmpty when nothing is to be served yet (nothing there, or a
  // request whose place is held but which is not on the socket yet); kCorrupt when the ring
  // or the record breaks the protocol.
  RingStatus RingHead(Session& s, Head* head);
  bool ServeHead(Session& s, const Head& head);
  bool RequestOnSocket(Session& s);
  void OnRingSocket(PodId id);
  // A request read (from the socket or the ring) goes to Dispatch. false: dropped.
  bool Serve(Session& s, const char* buf, size_t n, UniqueFd* fds, int nfds);
  // Serves a client the gate (or Adopt) identified, or keeps it until it reads why not.
  void Take(PodGate::Identified c);
  // Opens the ledger of a new client the gate identified; else sets why it is refused.
  void Admit(Session& s, const std::string& identity_error);
  void OnReadable(PodId id);
  // Watches a session's socket, as Take does for a new one.
  void WatchSocket(Session& s);
  void Send(const Call& call, int status, const proto::Response& body, const int* fds, int nfds);
  // Handles one datagram. false: protocol violation.
  bool Dispatch(Session& s, const char* buf, size_t len, UniqueFd* fds, int nfds);
  Session* Find(PodId id);
  // false + *error when live sessions hold `who`'s address from another network namespace.
  bool AddressFree(const PodIdentity& who, std::string* error) const;

  EventLoop& loop_;
  IdentityResolver& identity_;
  Quotas& quotas_;
  Handler& handler_;
  UniqueFd listen_;
  std::unique_ptr<PodGate> gate_;  // after listen_: goes first
  PodId next_id_ = 1;
  std::unordered_map<PodId, std::unique_ptr<Session>> sessions_;
  std::deque<std::pair<uint64_t, PodId>> hello_deadlines_;  // in adoption order
  size_t refused_ = 0;
  uint64_t refusals_ = 0;
  EventLog* events_ = nullptr;
  std::map<std::pair<uint32_t, int>, uint64_t> errors_;
  std::map<std::string, uint64_t> ends_;
  TrafficSink* traffic_sink_ = nullptr;
  ClaimRefusals claim_refusals_{kClaimRefusalNames};
  uint64_t events_replaced_ = 0;  // waiting events replaced by newer ones, in all
  LogLimiter refusal_log_;
  uint64_t hello_timeout_ns_ = kHelloTimeoutNs;
  uint64_t answer_spin_ns_ = 0;
  std::vector<PodId> ring_pods_;  // sessions with a request ring, in hand-over order
  std::vector<PodId> polling_;    // Poll's copy of ring_pods_ (kept for its capacity)
  std::vector<int> served_;       // Poll: requests served this turn, by polling_ index
  uint32_t shown_cpu_ = 0;        // the CPU the rings' control blocks show (router_cpu)
};

}  // namespace ff::router
