#include "router.h"

#include <malloc.h>
#include <sched.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "base/table_store.h"
#include "freeflow/ipv4.h"
#include "nodes/tcp_transport.h"
#include "nodes/tls.h"

namespace ff::router {

bool MakeNodeDeps(const RouterConfig& config, RouterDeps* deps, std::string* error) {
  deps->identity = MakeNetnsIdentityResolver({config.overlay, config.allow_host_network_clients});
  if (config.allow_host_network_clients) {
    spdlog::warn(
        "--allow-host-network-clients is set: processes in the router's own network namespace "
        "are served as the pod whose overlay address this namespace holds; every process "
        "with host networking on this node can act as that pod");
  }
  if (config.control_plane.empty()) return true;
  const cp::Endpoint self{config.node_name, config.host_ip, config.port};
  std::string err;
  cp::Options options;
  options.etcd = config.etcd;
  deps->control_plane = cp::MakeControlPlane(config.control_plane, self, options, &err);
  if (deps->control_plane == nullptr) {
    *error = "control plane " + config.control_plane + ": " + err;
    return false;
  }
  std::shared_ptr<const TlsContext> tls;
  if (config.insecure_node_links) {
    spdlog::warn(
        "--insecure-node-links is set: links to other routers are PLAINTEXT and "
        "UNAUTHENTICATED; anyone who reaches port {} can act as a router and read or forge "
        "cross-node traffic. Use it for benchmarks only.",
        config.port);
  } else {
    tls =
        TlsContext::Load({config.tls_ca, config.tls_cert, config.tls_key}, config.node_name, &err);
    if (tls == nullptr) {
      *error = "node links need TLS: " + err +
               ". Make a CA and node certificates with scripts/ff-certs.sh and pass --tls-ca, "
               "--tls-cert and --tls-key, or --insecure-node-links for a benchmark";
      return false;
    }
  }
  deps->transport = std::make_unique<TcpTransport>(TcpTransport::Options{
      config.node_name, config.host_ip, config.port, config.peer_timeout_ms, std::move(tls)});
  return true;
}

Router::Router(RouterConfig config, RouterDeps deps)
    : config_(std::move(config)),
      identity_(std::move(deps.identity)),
      transport_(std::move(deps.transport)),
      stream_probe_(deps.streams != nullptr ? std::move(deps.streams) : MakeSockDiagProbe()),
      directory_(std::move(deps.control_plane),
                 cp::Endpoint{config_.node_name, config_.host_ip, config_.port}),
      quotas_(config_.pod_limits),
      listeners_({config_.direct_port_lo, config_.direct_port_hi, config_.direct_accept_timeout_ns,
                  config_.direct_seal},
                 loop_),
      resume_(config_.resume_grace_ns),
      executor_(CrossNode()),
      forwarder_({config_.poll_us, config_.resolve_timeout_ms, config_.overlay}, loop_,
                 CrossNode()),
      cm_(CmService::Parts{loop_, sessions_, directory_, transport_.get(), quotas_, config_.overlay,
                           &resume_}),
      sockets_(TcpModeService::Parts{loop_, sessions_, quotas_, *stream_probe_, config_.node_name,
                                     config_.overlay, config_.stream_gc_period_ns,
                                     config_.stream_unseen_grace_ns}),
      broker_(Broker::Parts{tables_, sessions_, directory_, forwarder_, executor_, quotas_, cm_,
                            sockets_, direct_, config_.node_name, config_.overlay}),
      sessions_(loop_, *identity_, quotas_, broker_) {
  sessions_.set_hello_timeout(config_.hello_timeout_ns);
  sessions_.set_answer_spin(config_.spin_us * 1000ull);
  sessions_.set_traffic_sink(&traffic_);
  if (!config_.cri_endpoint.empty()) names_ = std::make_unique<PodNames>(config_.cri_endpoint);
  cm_.set_event_spin(config_.cm_spin_us * 1000ull);
}

Router::~Router() = default;

bool Router::Start(std::string* error) {
  // 1. The event loop everything else registers with.
  if (const int rc = loop_.Init()) {
    *error = std::string("cannot create the event loop: ") + std::strerror(rc);
    return false;
  }
  // 2. The host folder: one router per socket name; the container library for pods.
  bool took_over = false;
  if (!folder_.Take(config_.dir, config_.name, config_.library_source, error)) {
    if (!folder_.held_by_another() || !config_.take_over || !TakeOverOrWait(&took_over, error))
      return false;
  }
  if (config_.socket_library_source.empty()) {
    spdlog::info(
        "libfsocket.so not found next to ffrouter (--socket-library): TCP mode is "
        "unavailable to pods");
  } else if (!folder_.InstallSocketLibrary(config_.socket_library_source, error)) {
    return false;
  }
  if (!RouterTables().movable()) {
    spdlog::info("the tables pods read are sealed memfds: no private tmpfs for them ({})",
                 RouterTables().why_not());
  }
  // 3. Where pods live, and the links to the other routers.
  if (!directory_.Start(error)) {
    *error = "control plane " + config_.control_plane + ": " + *error;
    return false;
  }
  if (took_over) tables_.ForEachPod([&](const Pod& p) { directory_.Publish(p.who.ip); });
  if (transport_ != nullptr && !transport_->Start(loop_, *this, error)) return false;
  // 4. Retries, deadlines and sweeps.
  if (const int rc = timer_.Start(loop_, [this] { OnTimer(); })) {
    *error = std::string("cannot create a timer: ") + std::strerror(rc);
    return false;
  }
  timer_.Arm(kIdleTickNs);
  // 5. Metrics, when asked for (before pods come: a bad address fails the start).
  if (!config_.metrics_address.empty()) {
    if (!metrics_.Start(
            config_.metrics_address, loop_, [this] { return RenderMetrics(); }, error))
      return false;
    spdlog::info("metrics on http://{}/metrics (port {})", config_.metrics_address,
                 metrics_.port());
  }
  // 6. The admin socket (ffctl). A name already taken (only a process of the node's own
  // network namespace can take it) costs the admin ffctl, not the node its router.
  quotas_.set_event_log(&events_);
  sessions_.set_event_log(&events_);
  if (std::string why; !admin_.Start(AdminSocketName(config_.dir, config_.name), &why))
    spdlog::error("{}: ffctl cannot reach this router", why);
  // 7. Pods may come.
  UniqueFd sock;
  if (!took_over &&
      (!folder_.BindSocket(&sock, error) || !sessions_.Listen(std::move(sock), error)))
    return false;
  // 8. A successor may take over (docs/handover.md); without this socket it cannot.
  if (std::string why; !ListenForSuccessor(&why)) spdlog::error("{}", why);
  spdlog::info("ffrouter listening on {} (overlay {}, node {})", folder_.socket_path(),
               config_.overlay.ToString(), config_.node_name);
  if (transport_ != nullptr) {
    spdlog::info("routers reach this node at {}:{} (control plane {})", FormatIpv4(config_.host_ip),
                 config_.port, config_.control_plane);
    if (config_.direct_path) {
      spdlog::info("across nodes: direct connections between pods (listeners on ports {}-{}, {})",
                   config_.direct_port_lo, config_.direct_port_hi,
                   config_.direct_seal == SealMode::kEncrypt ? "encrypted" : "authenticated only");
    } else {
      spdlog::info("across nodes: relayed through the routers (--cross-node-path=relay)");
    }
  }
  return true;
}

void Router::Run() {
  while (!loop_.stopped()) {
    if (stats_requested_ != 0) {
      stats_requested_ = 0;
      spdlog::info("stats: {}", StatsLine());
    }
    // While cross-node traffic flows with --poll-us, poll proxies instead of sleeping.
    const bool polling = forwarder_.Polling();
    const int n = loop_.RunOnce(polling ? 0 : -1);
    if (polling && n == 0) {
      if (!forwarder_.PollAll()) ::sched_yield();
      if (!forwarder_.Polling()) forwarder_.PollAll();  // the window closed: arm the doorbells
    }
    if (successor_) ServeSuccessor();  // between turns (handover.cc)
  }
  if (handed_over_) return;  // the successor serves them now
  spdlog::info("ffrouter stopping; telling {} clients", sessions_.count());
  sessions_.NotifyAll(proto::EventType::kShutdown);
}

void Router::Adopt(UniqueFd sock) {
  const int fd = sock.release();
  loop_.Post([this, fd] { sessions_.Adopt(UniqueFd(fd)); });
}

// Answers and notifications travel on links this router dialled; requests on the others.
Router::Verdict Router::OnMessage(LinkId link, const NodeMessage& m) {
  if (m.type == wire::Type::kCm) return cm_.OnMessage(link, m);
  if (m.type == wire::Type::kHandingOver || m.type == wire::Type::kResume ||
      m.type == wire::Type::kResumed)
    return OnResumeMessage(link, m);
  forwarder_.NoteTraffic();
  if (transport_->Dialled(link)) return forwarder_.OnMessage(link, m);
  return executor_.OnMessage(link, m);
}

void Router::OnDrained(LinkId link) {
  forwarder_.OnDrained(link);
  executor_.OnDrained(link);
}

void Router::OnLinkDown(LinkId link, const std::string&) {
  ParkChannels(link);  // when its peer said it is being replaced
  forwarder_.OnLinkDown(link);
  executor_.OnLinkDown(link);
  cm_.OnLinkDown(link);
}

void Router::OnTimer() {
  if (const uint64_t now = MonotonicNs(); now - last_beat_ns_ >= kHeartbeatNs) {
    last_beat_ns_ = now;
    if (const int rc = folder_.Beat())
      spdlog::warn("cannot touch the heartbeat {}: {}", folder_.alive_path(), std::strerror(rc));
  }
  sessions_.Sweep();
  admin_.Tick(MonotonicNs());
  listeners_.Tick(MonotonicNs());
  cm_.Tick();
  sockets_.Tick();
  if (transport_) TickResume(MonotonicNs());
  const bool senders_wait = executor_.Retry();
  const bool forwarder_waits = forwarder_.Tick();
  fast_tick_ = senders_wait || forwarder_waits;
  timer_.Arm(fast_tick_ ? kRetryTickNs : kIdleTickNs);
  TrimHeap(MonotonicNs());
}

void Router::TrimHeap(uint64_t now) {
  uint64_t ended = 0;
  for (const auto& [reason, n] : sessions_.ends()) ended += n;
  if (ended != ends_seen_) {  // still closing: wait for a quiet tick
    ends_seen_ = ended;
    trim_due_ = true;
    return;
  }
  if (!trim_due_ || now - last_trim_ns_ < kHeapTrimIntervalNs) return;
  trim_due_ = false;
  last_trim_ns_ = now;
  ::malloc_trim(0);
}

// Something waits for a retry: tick fast until nothing does.
void Router::RetrySoon() {
  if (fast_tick_) return;
  fast_tick_ = true;
  timer_.Arm(kRetryTickNs);
}

std::string Router::StatsLine() const {
  const ResourceTables::Totals t = tables_.totals();
  return fmt::format(
      "sessions={} refused={} pods={} accounts={} qps={} objects={} regions={} "
      "mapped_regions={} mr_entries={} proxies={} resolving={} nudges={} senders={} "
      "ud_rings_taken={} ud_links_recycled={} direct_conns={} direct_listeners={} "
      "direct_refused={} cm_ids={} streams={} listeners={} sock_asks={} links={} "
      "events_waiting={} events_replaced={} unidentified={} accept_paused={} fds={} rss_kib={}",
      sessions_.count(), sessions_.refused(), t.pods, quotas_.accounts(), t.qps, t.objects,
      t.regions, t.mapped_regions, t.mr_entries, forwarder_.proxies(), forwarder_.resolving(),
      forwarder_.nudges(), executor_.senders(), executor_.ud_rings_taken(),
      forwarder_.ud_links_recycled(), direct_.size(), listeners_.open(), listeners_.refused(),
      cm_.ids(), sockets_.streams(), sockets_.listeners(), sockets_.asks(),
      transport_ != nullptr ? transport_->LinkCount() : 0, sessions_.events_waiting(),
      sessions_.events_replaced(), sessions_.unidentified(), sessions_.accept_paused() ? 1 : 0,
      OpenDescriptors(), ResidentKib());
}

}  // namespace ff::router
