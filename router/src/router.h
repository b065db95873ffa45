// The per-node freeflow router: composes the components that each do one job.
//
//   HostFolder     the shared folder: one router per folder, container library, socket
//   EventLoop      epoll reactor, deferred work, the stop switch
//   PodSessions    the pods' Unix socket: identity, request decoding, answers, events
//   Broker         answers pod requests; QPs of this node meet through it
//   Quotas         what each pod (overlay address) may hold, and what it holds
//   ResourceTables what each pod holds; which QP produces into which ring
//   MrTable        each pod's published MR table
//   Directory      where pods live (control-plane glue)
//   NodeTransport  links to other routers (TCP, or in memory for tests)
//   DirectConnections, DirectListeners  connections between pod processes on two nodes
//                  (docs/direct-path.md): which the router knows, listeners inside pods
//   Forwarder      a local QP's link to a QP on another node (initiator side)
//   Executor       QPs on other nodes producing into local QPs (target side)
//   LinkResume     channels to other nodes parked while a router is replaced
//   CmService      rdma_cm: the kernel behind each pod's /dev/infiniband/rdma_cm
//   TcpModeService  TCP mode (libfsocket): socket sessions, listeners, connection records
//   MetricsService  Prometheus /metrics, rendered on the loop (--metrics-address)
//   AdminService    ffctl's admin socket (root, the node's network namespace only)
//
// Single-threaded: everything runs on the loop's thread; Stop(), RequestStats() and Adopt()
// may be called from any thread (Stop() and RequestStats() also from a signal handler).
#pragma once

#include <signal.h>

#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "admin_service.h"
#include "base/event_loop.h"
#include "base/host_folder.h"
#include "base/quotas.h"
#include "broker.h"
#include "cm/cm_service.h"
#include "direct/direct_connections.h"
#include "direct/direct_listener.h"
#include "identity/identity.h"
#include "identity/pod_names.h"
#include "nodes/directory.h"
#include "nodes/executor.h"
#include "nodes/forwarder.h"
#include "nodes/link_resume.h"
#include "nodes/node_transport.h"
#include "objects/resources.h"
#include "options.h"
#include "pods/pod_sessions.h"
#include "router_metrics.h"
#include "tcpmode/probe.h"
#include "tcpmode/service.h"
#include "traffic_totals.h"

namespace ff::metrics {
class Exposition;
}

namespace ff::router {

// The router's outside edges, replaceable in tests.
struct RouterDeps {
  std::unique_ptr<IdentityResolver> identity;
  std::unique_ptr<cp::ControlPlane> control_plane;  // nullptr: this node only
  std::unique_ptr<NodeTransport> transport;         // nullptr: this node only
  std::unique_ptr<TcpModeProbe> streams;            // nullptr: sock_diag (MakeSockDiagProbe)
};

// The collaborators of a router on a real node: identity by network namespace, the control
// plane the config names, TCP links. false + *error on a bad control-plane spec.
bool MakeNodeDeps(const RouterConfig& config, RouterDeps* deps, std::string* error);

class Router final : private NodeTransport::Handler {
 public:
  Router(RouterConfig config, RouterDeps deps);
  ~Router() override;

  // Takes the host folder, starts the control plane and the node links, and listens for
  // pods. false + *error (a sentence a person can act on).
  bool Start(std::string* error);
  // Serves until Stop(), then tells every pod that the router stops.
  void Run();
  void Stop() { loop_.Stop(); }
  // Logs one line of what the router holds (StatsLine) from its loop; async-signal-safe.
  void RequestStats() {
    stats_requested_ = 1;
    loop_.Wake();
  }
  // "sessions=N pods=N qps=N ... fds=N rss_kib=N": counts of what the router holds. The
  // loop's thread only.
  std::string StatsLine() const;
  // Serves an already-connected pod socket (a test's socketpair end). Thread-safe.
  void Adopt(UniqueFd sock);
  // Runs `fn` on the loop's thread during its next turn. Thread-safe.
  void Post(std::function<void()> fn) { loop_.Post(std::move(fn)); }

  std::string socket_path() const { return folder_.socket_path(); }
  // Whether Run() ended because a successor took this router's state (docs/handover.md):
  // the process must then close its descriptors without releasing anything and exit.
  bool handed_over() const { return handed_over_; }
  // After a hand-over: the connection to the successor, whose end tells it that this router
  // has closed everything it held (the caller closes it last), or -1.
  int successor_socket() const { return handed_over_end_ ? handed_over_end_.get() : -1; }
  // The port /metrics is served on (0: not served; --metrics-address).
  uint16_t metrics_port() const { return metrics_.port(); }

 private:
  Verdict OnMessage(LinkId link, const NodeMessage& m) override;
  void OnDrained(LinkId link) override;
  void OnLinkDown(LinkId link, const std::string& why) override;
  void OnTimer();
  // Channels to other nodes across a router's replacement (link_resume.cc): the messages
  // about it, a link going down with its channels parked, parked channels resumed (dialling
  // their node) or failed at the deadline, and the old router's word on each of its links.
  Verdict OnResumeMessage(LinkId link, const NodeMessage& m);
  void ParkChannels(LinkId link);
  void TickResume(uint64_t now);
  void AnnounceHandover();
  // The hand-over (handover.cc, docs/handover.md). The old side: the socket a successor
  // connects to; what keeps this router's state from moving ("" when nothing does); the
  // exchange, true once the successor serves. OnSuccessor only takes the connection: Run
  // serves it between two turns of the loop (ServeSuccessor), when no callback of a turn
  // and no deferred work is left to run on state that has moved.
  bool ListenForSuccessor(std::string* error);
  void OnSuccessor();
  void ServeSuccessor();
  std::string WhyNoHandover(uint32_t version) const;
  bool HandOver(int sock);
  // The new side, when another router holds the folder's lock: asks it for its state;
  // *retry when nothing of it was taken yet (it refused, or the exchange broke off before
  // its state came), so that asking again is safe. TakeOverOrWait asks until it hands over,
  // or lets go of the folder (then takes it as a first router does: *took_over false), or
  // --take-over-wait-s passes. *error names the serving router on entry (HostFolder::Take).
  bool TakeOver(std::string* error, bool* retry);
  bool TakeOverOrWait(bool* took_over, std::string* error);
  void RetrySoon();
  // Once sessions have ended and no more ended for a tick, gives the heap's free pages back
  // to the system (at most once per kHeapTrimIntervalNs): what pods held goes when they go.
  void TrimHeap(uint64_t now);
  // What ffctl gets for one request line (admin_answers.cc): a JSON document.
  std::string AdminAnswer(const std::string& request) const;
  nlohmann::json AdminPods() const;
  nlohmann::json AdminQps(uint32_t only) const;
  // The metrics a scrape gets (router_metrics.cc, docs/metrics.md); the loop's thread only.
  std::string RenderMetrics();
  mutable size_t render_bytes_ = 0;  // the last rendering's size (the next one reserves it)
  void RenderQuotas(metrics::Exposition& out) const;
  void RenderNodeRefusals(metrics::Exposition& out) const;
  void RenderPodQps(metrics::Exposition& out) const;
  void RenderPeers(metrics::Exposition& out) const;
  void RenderTraffic(metrics::Exposition& out) const;
  void RenderPodNames(metrics::Exposition& out) const;
  // What the executor and the forwarder share (the members it names are constructed first,
  // but sessions_, which it only refers to).
  CrossNodeParts CrossNode() {
    return {transport_.get(),
            tables_,
            sessions_,
            directory_,
            quotas_,
            [this] { RetrySoon(); },
            {config_.direct_path, config_.direct_datagrams, config_.direct_seal, &direct_,
             &listeners_}};
  }

  RouterConfig config_;
  EventLoop loop_;
  std::unique_ptr<IdentityResolver> identity_;
  std::unique_ptr<NodeTransport> transport_;
  std::unique_ptr<TcpModeProbe> stream_probe_;
  HostFolder folder_;
  Directory directory_;
  EventLog events_;  // refusals for ffctl events, noted by quotas_ and sessions_
  // What pods' libraries say they carried out (sessions_ reads their ledgers into it).
  TrafficTotals traffic_{config_.node_name, [this](uint32_t ip) {
                           const std::optional<cp::Endpoint> at = directory_.Locate(ip);
                           return at ? at->node : std::string();
                         }};
  Quotas quotas_;
  ResourceTables tables_;
  DirectConnections direct_;
  DirectListeners listeners_;
  LinkResume resume_;
  // Constructed in this order: each takes references to those above it and to sessions_,
  // which is constructed last because it takes broker_ as its handler.
  Executor executor_;
  Forwarder forwarder_;
  CmService cm_;
  TcpModeService sockets_;
  Broker broker_;
  PodSessions sessions_;
  Timer timer_;
  bool fast_tick_ = false;
  uint64_t last_beat_ns_ = 0;  // HostFolder::Beat, at most once a second
  uint64_t ends_seen_ = 0;     // sessions ended, as TrimHeap last counted them
  bool trim_due_ = false;      // some ended since the heap was last trimmed
  uint64_t last_trim_ns_ = 0;
  volatile sig_atomic_t stats_requested_ = 0;
  bool handed_over_ = false;
  UniqueFd successor_listen_;
  UniqueFd successor_;  // a successor's connection, taken, not served yet
  UniqueFd handed_over_end_;  // that connection once handed over (successor_socket())
  EventLoop::WatchId successor_watch_ = 0;
  AdminService admin_{loop_, [this](const std::string& request) { return AdminAnswer(request); }};
  // Pods' names from the container runtime (--cri-endpoint); nullptr: not asked.
  std::unique_ptr<PodNames> names_;
  // Last, so that it is destroyed first: it renders what the members above hold.
  MetricsService metrics_;
};

}  // namespace ff::router
