// What the router exposes at /metrics, and how a scrape reaches the loop's thread. The
// families are listed, with what each means, in docs/metrics.md.
#include "router_metrics.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include "freeflow/ipv4.h"
#include "freeflow/metrics/exposition.h"
#include "freeflow/qp_kind.h"
#include "freeflow/version.h"
#include "router.h"

namespace ff::router {
namespace {

using metrics::Kind;

// A scrape's answer, handed from the loop's thread to the endpoint's; shared so that an
// answer that comes after the endpoint gave up on it has somewhere to go.
struct Answer {
  std::mutex mu;
  std::condition_variable cv;
  std::optional<std::string> text;
};

double Seconds(uint64_t ns) { return static_cast<double>(ns) / 1e9; }

double CpuSeconds() {
  rusage u{};
  if (::getrusage(RUSAGE_SELF, &u) != 0) return 0;
  auto s = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec / 1e6; };
  return s(u.ru_utime) + s(u.ru_stime);
}

void Gauge(metrics::Exposition& out, const char* name, const char* help, uint64_t value) {
  out.Family(name, Kind::kGauge, help);
  out.Sample(value);
}

void Counter(metrics::Exposition& out, const char* name, const char* help, uint64_t value) {
  out.Family(name, Kind::kCounter, help);
  out.Sample(value);
}

// The process's own families, read from the kernel: rendered on the endpoint's thread, as
// they need nothing of the loop's (listing /proc/self/fd takes milliseconds at tens of
// thousands of descriptors, which the loop would spend on every scrape).
std::string ProcessFamilies() {
  metrics::Exposition out;
  out.Family("freeflow_router_build_info", Kind::kGauge, "The router's version and commit.");
  out.Sample({{"version", Version()}, {"commit", Commit()}}, uint64_t{1});
  out.Family("process_cpu_seconds_total", Kind::kCounter, "CPU time the router used.");
  out.Sample({}, CpuSeconds());
  Gauge(out, "process_open_fds", "Descriptors the router holds.", OpenDescriptors());
  Gauge(out, "process_resident_memory_bytes", "The router's resident memory.",
        ResidentKib() * 1024);
  return out.Take();
}

}  // namespace

bool MetricsService::Start(const std::string& address, EventLoop& loop,
                           std::function<std::string()> render, std::string* error) {
  auto shared = std::make_shared<std::function<std::string()>>(std::move(render));
  auto on_scrape = [&loop, shared]() -> std::optional<std::string> {
    auto answer = std::make_shared<Answer>();
    loop.Post([answer, shared] {
      std::string text = (*shared)();
      std::lock_guard<std::mutex> lock(answer->mu);
      answer->text = std::move(text);
      answer->cv.notify_one();
    });
    std::string process = ProcessFamilies();
    std::unique_lock<std::mutex> lock(answer->mu);
    answer->cv.wait_for(lock, std::chrono::milliseconds(kRenderWaitMs),
                        [&] { return answer->text.has_value(); });
    if (!answer->text) return std::nullopt;
    return process + *answer->text;
  };
  return endpoint_.Start(address, std::move(on_scrape), error);
}

size_t OpenDescriptors() {
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return 0;
  size_t n = 0;
  while (const dirent* e = ::readdir(d)) n += e->d_name[0] != '.' ? 1 : 0;
  ::closedir(d);
  return n > 0 ? n - 1 : 0;
}

uint64_t ResidentKib() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  unsigned long long size = 0, resident = 0;
  const int got = std::fscanf(f, "%llu %llu", &size, &resident);
  std::fclose(f);
  return got == 2 ? resident * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)) / 1024 : 0;
}

std::string Router::RenderMetrics() {
  sessions_.ReadTraffic();
  metrics::Exposition out;
  out.Reserve(render_bytes_ + render_bytes_ / 8);
  // The loop.
  const EventLoop::Load& load = loop_.load();
  out.Family("freeflow_router_loop_busy_seconds_total", Kind::kCounter,
             "Time the router's loop spent working (or polling) rather than waiting.");
  out.Sample({}, Seconds(load.busy_ns));
  out.Family("freeflow_router_loop_turn_seconds", Kind::kHistogram,
             "How long the loop worked from a wake-up with events to its next wait: what an "
             "event arriving meanwhile waited at most.");
  std::array<double, EventLoop::kTurnBuckets.size()> bounds{};
  for (size_t i = 0; i < bounds.size(); ++i) bounds[i] = Seconds(EventLoop::kTurnBuckets[i]);
  out.Histogram({}, bounds, load.le, load.turns, Seconds(load.turn_ns));
  // What the router holds for pods, on this node.
  const ResourceTables::Totals t = tables_.totals();
  Gauge(out, "freeflow_router_sessions", "Pod processes with a session.", sessions_.count());
  Gauge(out, "freeflow_router_pods", "Pods (overlay addresses) that hold anything.",
        quotas_.accounts());
  Gauge(out, "freeflow_router_qps", "Queue pairs.", t.qps);
  Gauge(out, "freeflow_router_objects", "CQs, completion channels and SRQs.", t.objects);
  Gauge(out, "freeflow_router_regions", "Registered memory regions.", t.regions);
  Gauge(out, "freeflow_router_mapped_regions", "Regions the router maps for other nodes.",
        t.mapped_regions);
  Gauge(out, "freeflow_router_mr_entries", "Entries of the pods' MR tables.", t.mr_entries);
  Gauge(out, "freeflow_router_cm_ids", "rdma_cm ids.", cm_.ids());
  Gauge(out, "freeflow_router_tcp_connections", "TCP-mode connection records.", sockets_.streams());
  Gauge(out, "freeflow_router_tcp_listeners", "TCP-mode listening ports registered.",
        sockets_.listeners());
  Counter(out, "freeflow_router_tcp_requests_total",
          "TCP-mode SockConnect and SockClaim requests answered.", sockets_.asks());
  // Across nodes.
  Gauge(out, "freeflow_router_node_links", "Links to other routers, both directions.",
        transport_ != nullptr ? transport_->LinkCount() : 0);
  Gauge(out, "freeflow_router_cross_node_channels", "Relayed channels to QPs on other nodes.",
        forwarder_.proxies());
  Gauge(out, "freeflow_router_resolving", "Connects waiting to learn where a pod lives.",
        forwarder_.resolving());
  Gauge(out, "freeflow_router_remote_senders", "QPs on other nodes sending into this node's.",
        executor_.senders());
  Gauge(out, "freeflow_router_direct_connections",
        "Direct connections between pod processes the router set up.", direct_.size());
  Gauge(out, "freeflow_router_direct_listeners", "Listeners for direct connections.",
        listeners_.open());
  RenderNodeRefusals(out);
  Counter(out, "freeflow_router_ud_links_recycled_total",
          "UD channels given up for another of the same pod at its quota.",
          forwarder_.ud_links_recycled());
  Counter(out, "freeflow_router_ud_rings_taken_total", "UD rings taken from a sender for another.",
          executor_.ud_rings_taken());
  // The pods' socket and its refusals.
  Counter(out, "freeflow_router_sessions_refused_total",
          "Pod connections refused (identity, address, or the session quota).",
          sessions_.refusals());
  Gauge(out, "freeflow_router_refused_sessions_waiting",
        "Refused connections kept until their HELLO reads the reason.", sessions_.refused());
  Counter(out, "freeflow_router_admin_refused_total",
          "Admin socket connections refused (not root, or too many).", admin_.refused());
  Gauge(out, "freeflow_router_unidentified_connections",
        "Pod connections waiting to be identified.", sessions_.unidentified());
  Gauge(out, "freeflow_router_accept_paused",
        "1 while the router stopped accepting pods for lack of descriptors.",
        sessions_.accept_paused() ? 1 : 0);
  Gauge(out, "freeflow_router_events_waiting", "Events waiting for pods' full event sockets.",
        sessions_.events_waiting());
  Counter(out, "freeflow_router_events_replaced_total", "Waiting events replaced by newer ones.",
          sessions_.events_replaced());
  out.Family("freeflow_router_request_errors_total", Kind::kCounter,
             "Pod requests answered with an error, by request op (protocol.h's proto::Op) and "
             "errno.");
  for (const auto& [key, n] : sessions_.errors()) {
    const char* name = ::strerrorname_np(key.second);
    out.Sample({{"op", std::to_string(key.first)},
                {"errno", name != nullptr ? name : std::to_string(key.second)}},
               n);
  }
  out.Family("freeflow_router_session_ends_total", Kind::kCounter,
             "Pod sessions ended, by reason (the client closed it, or broke the protocol).");
  for (const auto& [why, n] : sessions_.ends()) out.Sample({{"reason", why}}, n);
  RenderQuotas(out);
  RenderPodQps(out);
  RenderPeers(out);
  RenderTraffic(out);
  RenderPodNames(out);
  std::string text = out.Take();
  render_bytes_ = text.size();
  return text;
}

// Refusals of what came from outside the pod socket: direct listeners, the router port, other
// routers' requests.
void Router::RenderNodeRefusals(metrics::Exposition& out) const {
  out.Family("freeflow_router_direct_refused_total", Kind::kCounter,
             "Connections to direct listeners closed as not the expected one, by reason.");
  listeners_.refusals().ForEach([&](const char* why, uint64_t n) {
    out.Sample({{"reason", why}}, n);
  });
  out.Family("freeflow_router_node_port_refused_total", Kind::kCounter,
             "Connections to the router port closed before they were a router, by reason.");
  if (transport_ != nullptr) {
    for (const auto& [why, n] : transport_->PortRefusals()) out.Sample({{"reason", why}}, n);
  }
  out.Family("freeflow_router_peer_refused_total", Kind::kCounter,
             "Requests of other routers refused, by request (a QP's connect, an rdma_cm "
             "message) and reason.");
  executor_.refusals().ForEach([&](const char* why, uint64_t n) {
    out.Sample({{"request", "connect"}, {"reason", why}}, n);
  });
  cm_.refusals().ForEach([&](const char* why, uint64_t n) {
    out.Sample({{"request", "rdma_cm"}, {"reason", why}}, n);
  });
}

void Router::RenderQuotas(metrics::Exposition& out) const {
  out.Family("freeflow_router_quota_refusals_total", Kind::kCounter,
             "Requests refused because a pod was at its quota, by quota.");
  for (const QuotaSpec& q : kQuotaSpecs)
    out.Sample({{"quota", ResourceName(q)}}, quotas_.refusals()[static_cast<size_t>(q.quota)]);
  // Limits and holdings, counts and bytes in families of their own.
  for (const bool bytes : {false, true}) {
    out.Family(bytes ? "freeflow_router_pod_limit_bytes" : "freeflow_router_pod_limit",
               Kind::kGauge, "What each pod may hold, by quota.");
    for (const QuotaSpec& q : kQuotaSpecs)
      if ((q.unit != 1) == bytes)
        out.Sample({{"resource", ResourceName(q)}}, quotas_.limit(q.quota));
    out.Family(bytes ? "freeflow_router_pod_held_bytes" : "freeflow_router_pod_held", Kind::kGauge,
               "What a pod holds, by quota (pods that hold anything).");
    quotas_.ForEachAccount([&](uint32_t ip, const Quotas::Counts& used, const Quotas::Counts&) {
      const std::string address = FormatIpv4(ip);
      for (const QuotaSpec& q : kQuotaSpecs)
        if ((q.unit != 1) == bytes)
          out.Sample({{"address", address}, {"resource", ResourceName(q)}},
                     used[static_cast<size_t>(q.quota)]);
    });
  }
  out.Family("freeflow_router_pod_quota_refusals_total", Kind::kCounter,
             "Requests of a pod refused at its quota, since it last held nothing.");
  quotas_.ForEachAccount([&](uint32_t ip, const Quotas::Counts&, const Quotas::Counts& refused) {
    const std::string address = FormatIpv4(ip);
    for (const QuotaSpec& q : kQuotaSpecs)
      out.Sample({{"address", address}, {"quota", ResourceName(q)}},
                 refused[static_cast<size_t>(q.quota)]);
  });
}

void Router::RenderPodQps(metrics::Exposition& out) const {
  out.Family("freeflow_router_pod_qps", Kind::kGauge, "Each pod's QPs, by type.");
  for (const auto& [key, n] : tables_.QpsByAddressAndType()) {
    out.Sample({{"address", FormatIpv4(key.first)}, {"type", QpTypeName(key.second)}}, n);
  }
  const ResourceTables::QpStates states = tables_.QpsByState();
  out.Family("freeflow_router_qps_by_state", Kind::kGauge,
             "The node's QPs: UD (datagram), RC/UC whose owner named a peer at RTR (connected), "
             "and RC/UC that have not (unconnected).");
  out.Sample({{"state", "unconnected"}}, states.unconnected);
  out.Sample({{"state", "connected"}}, states.connected);
  out.Sample({{"state", "datagram"}}, states.datagram);
}

// Each other node's router this one had a ready link with, by its node name.
void Router::RenderPeers(metrics::Exposition& out) const {
  const std::vector<PeerView> peers =
      transport_ != nullptr ? transport_->Peers() : std::vector<PeerView>{};
  struct Figure {
    const char* name;
    Kind kind;
    const char* help;
    uint64_t PeerView::*field;
  };
  static constexpr Figure kFigures[] = {
      {"freeflow_router_link_connects_total", Kind::kCounter,
       "Links to the node's router that became ready.", &PeerView::connects},
      {"freeflow_router_link_losses_total", Kind::kCounter,
       "Ready links to the node's router that went down.", &PeerView::losses},
      {"freeflow_router_link_sent_messages_total", Kind::kCounter,
       "Messages sent to the node's router.", &PeerView::sent_messages},
      {"freeflow_router_link_sent_bytes_total", Kind::kCounter,
       "Message bytes sent to the node's router (without framing or TLS).", &PeerView::sent_bytes},
      {"freeflow_router_link_received_messages_total", Kind::kCounter,
       "Messages received from the node's router.", &PeerView::received_messages},
      {"freeflow_router_link_received_bytes_total", Kind::kCounter,
       "Message bytes received from the node's router.", &PeerView::received_bytes},
  };
  out.Family("freeflow_router_link_up", Kind::kGauge,
             "Ready links to the node's router now (0: none, the node was linked before).");
  for (const PeerView& p : peers) out.Sample({{"peer", p.peer}}, uint64_t{p.links_up});
  for (const Figure& f : kFigures) {
    out.Family(f.name, f.kind, f.help);
    for (const PeerView& p : peers) out.Sample({{"peer", p.peer}}, p.*f.field);
  }
}

// What the pods' libraries say they carried out (pods/traffic_claims.h), and what of it the
// router did not believe.
void Router::RenderTraffic(metrics::Exposition& out) const {
  const auto family = [&](const char* name, const char* help,
                          uint64_t TrafficTotals::Figures::*field) {
    out.Family(name, Kind::kCounter, help);
    for (const auto& [k, f] : traffic_.totals()) {
      out.Sample({{"placement", TrafficPlacementName(k.placement)},
                  {"peer_node", k.peer_node},
                  {"kind", TrafficKindName(k.kind)}},
                 f.*field);
    }
  };
  family("freeflow_router_operations_total",
         "Work requests this node's pods carried out, as their libraries count them, by "
         "placement (same_node, direct, relay), the peer's node and kind.",
         &TrafficTotals::Figures::ops);
  family("freeflow_router_operation_bytes_total",
         "Payload bytes of those work requests (messages, WRITEs and READs; 8 an atomic).",
         &TrafficTotals::Figures::bytes);
  Gauge(out, "freeflow_router_traffic_ledgers", "Sessions whose library counts its traffic.",
        sessions_.ledgers());
  out.Family("freeflow_router_traffic_claims_refused_total", Kind::kCounter,
             "What the router did not take from pods' traffic ledgers, by reason.");
  sessions_.claim_refusals().ForEach([&](const char* why, uint64_t n) {
    out.Sample({{"reason", why}}, n);
  });
}

// Each pod that holds anything, by the namespace and name the container runtime gives its
// address (--cri-endpoint): the join key for the families labelled by address.
void Router::RenderPodNames(metrics::Exposition& out) const {
  out.Family("freeflow_router_pod_info", Kind::kGauge,
             "1 for each pod that holds anything, with the namespace and name the container "
             "runtime gives its address (join on address).");
  if (names_ == nullptr) return;
  bool unnamed = false;
  quotas_.ForEachAccount([&](uint32_t ip, const Quotas::Counts&, const Quotas::Counts&) {
    const std::optional<PodNames::Name> name = names_->Find(ip);
    if (!name) {
      unnamed = true;
      return;
    }
    out.Sample({{"address", FormatIpv4(ip)}, {"namespace", name->ns}, {"pod", name->pod}},
               uint64_t{1});
  });
  if (unnamed) names_->Refresh();  // a pod started since the runtime was last asked
}

}  // namespace ff::router
