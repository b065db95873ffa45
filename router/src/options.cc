#include "options.h"

#include <ifaddrs.h>
#include <limits.h>
#include <netinet/in.h>
#include <sched.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "base/memory_limit.h"
#include "freeflow/version.h"

namespace ff::router {
namespace {

// A library the router installs in the shared folder is built next to it (build tree:
// ../<subdir>/<name>) or installed beside it or under ../lib/freeflow (install tree).
std::string DefaultLibrary(const char* subdir, const char* name) {
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  const auto dir = exe.parent_path();
  for (const auto& candidate :
       {dir / ".." / subdir / name, dir / name, dir / "../lib/freeflow" / name}) {
    if (std::filesystem::exists(candidate, ec)) return std::filesystem::canonical(candidate, ec);
  }
  return "";
}

// The first local IPv4 address inside `prefix` (the original DaemonSet's HOST_IP_PREFIX).
uint32_t AddressIn(const Ipv4Prefix& prefix) {
  struct ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return 0;
  uint32_t found = 0;
  for (struct ifaddrs* i = list; i != nullptr && found == 0; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    const uint32_t a = ntohl(reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr);
    if (prefix.Contains(a)) found = a;
  }
  ::freeifaddrs(list);
  return found;
}

// Flags as typed, before validation.
struct Raw {
  std::string prefix;
  std::string library = DefaultLibrary("verbs", "libffverbs.so");
  std::string socket_library = DefaultLibrary("fsocket", "libfsocket.so");
  std::string host_ip;
  std::string host_prefix;
  int port = kDefaultRouterPort;
  std::string etcd_user;  // USER or USER:PASSWORD
  std::string cross_node_path = "direct";
  std::string direct_ports =
      std::to_string(kDefaultDirectPortLo) + "-" + std::to_string(kDefaultDirectPortHi);
  std::string direct_seal = "encrypt";
};

// A numeric knob: its flag, where it goes, the values it accepts and what it does.
struct NumericFlag {
  const char* name;
  uint32_t* value;
  uint32_t lo, hi;
  const char* help;
};

// Every flag; the environment variables of the original FreeFlow DaemonSet fill in those
// not given on the command line.
void AddFlags(CLI::App& app, RouterConfig& c, Raw& raw) {
  app.option_defaults()->always_capture_default();
  app.add_option("--dir", c.dir, "shared folder mounted into pods")->envname("FREEFLOW_DIR");
  app.add_option("--name", c.name, "router name: socket <dir>/<name>.sock")->envname("FFR_NAME");
  app.add_option("--vnet-prefix", raw.prefix, "overlay (pod) network prefix, e.g. 10.244.0.0/16")
      ->envname("VNET_PREFIX");
  app.add_option("--library", raw.library, "container library to install as <dir>/libffverbs.so");
  app.add_option("--socket-library", raw.socket_library,
                 "TCP-mode library to install as <dir>/libfsocket.so (none found: no TCP mode)");
  app.add_option("--node-name", c.node_name, "this node's name")->envname("NODE_NAME");
  app.add_option("--host-ip", raw.host_ip, "this node's address for router-to-router traffic")
      ->envname("HOST_IP");
  app.add_option("--host-ip-prefix", raw.host_prefix, "or take the local address inside this")
      ->envname("HOST_IP_PREFIX");
  app.add_option("--port", raw.port, "router-to-router TCP port")->check(CLI::Range(1, 65535));
  app.add_option("--control-plane", c.control_plane,
                 "where pods live: static:FILE or etcd:URL[,URL..]; empty = this node only")
      ->envname("FREEFLOW_CONTROL_PLANE");
  app.add_option("--tls-ca", c.tls_ca, "CA certificate that signs every node's (PEM)")
      ->envname("FREEFLOW_TLS_CA");
  app.add_option("--tls-cert", c.tls_cert, "this node's certificate, naming --node-name (PEM)")
      ->envname("FREEFLOW_TLS_CERT");
  app.add_option("--tls-key", c.tls_key, "this node's private key (PEM)")
      ->envname("FREEFLOW_TLS_KEY");
  app.add_flag("--insecure-node-links", c.insecure_node_links,
               "plaintext, unauthenticated router-to-router links (benchmarks only)")
      ->envname("FREEFLOW_INSECURE_NODE_LINKS");
  app.add_flag("--take-over", c.take_over,
               "when another router serves --dir/--name, take its pods over without stopping "
               "them (docs/handover.md) instead of exiting")
      ->envname("FREEFLOW_TAKE_OVER");
  app.add_option("--take-over-wait-s", c.take_over_wait_s,
                 "with --take-over: while the serving router refuses, ask again for this long "
                 "(0: once); if it stops meanwhile, start as the first router")
      ->envname("FREEFLOW_TAKE_OVER_WAIT_S")
      ->check(CLI::Range(0u, 7u * 86400u));
  app.add_option("--ready-file", c.ready_file,
                 "a file that exists while this router serves (for a readiness probe)")
      ->envname("FREEFLOW_READY_FILE");
  const NumericFlag numeric[] = {
      {"--peer-timeout-ms", &c.peer_timeout_ms, 100, 600000,
       "silent peer routers are dead after it"},
      {"--resolve-timeout-ms", &c.resolve_timeout_ms, 0, 60000,
       "a connect waits this long for a new pod"},
      {"--poll-us", &c.poll_us, 0, 100000, "poll this long after cross-node traffic (0: sleep)"},
      {"--spin-us", &c.spin_us, 0, 10000, "poll this long after answering a pod (0: sleep)"},
      {"--cm-spin-us", &c.cm_spin_us, 0, 10000,
       "poll this long after an rdma_cm event between pods of this node"},
      {"--realtime-priority", &c.realtime_priority, 0, 99, "SCHED_RR priority (0: normal)"}};
  for (const NumericFlag& f : numeric)
    app.add_option(f.name, *f.value, f.help)->check(CLI::Range(f.lo, f.hi));
  app.add_option("--cross-node-path", raw.cross_node_path,
                 "across nodes: direct connections between pod processes, or the relay "
                 "through the routers")
      ->envname("FREEFLOW_CROSS_NODE_PATH")
      ->check(CLI::IsMember({"direct", "relay"}));
  app.add_option("--direct-ports", raw.direct_ports,
                 "LO-HI: the ports direct listeners bind in inside pods (the pod network "
                 "must admit them between pods)")
      ->envname("FREEFLOW_DIRECT_PORTS");
  app.add_option("--direct-seal", raw.direct_seal,
                 "direct connections' frames: encrypt, or authenticate only (a pod network "
                 "that encrypts); every router of a cluster the same")
      ->envname("FREEFLOW_DIRECT_SEAL")
      ->check(CLI::IsMember({"encrypt", "authenticate"}));
  app.add_flag("--direct-datagrams", c.direct_datagrams,
               "UD datagrams over direct connections too (off: relayed; docs/direct-path.md)")
      ->envname("FREEFLOW_DIRECT_DATAGRAMS");
  app.add_flag("--allow-host-network-clients", c.allow_host_network_clients,
               "serve processes in the router's own network namespace (host network)")
      ->envname("FREEFLOW_ALLOW_HOST_NETWORK_CLIENTS");
  for (const QuotaSpec& q : kQuotaSpecs) {
    const std::string unit = q.unit == 1 ? "" : " (MiB)";
    app.add_option(std::string("--max-") + q.name + "-per-pod",
                   c.pod_limits[static_cast<size_t>(q.quota)],
                   std::string("per-pod quota: ") + q.what + unit)
        ->envname(q.env)
        ->check(CLI::Range(1u, 1u << 30));
  }
  app.add_option("--metrics-address", c.metrics_address,
                 "host:port for Prometheus /metrics (off if empty; docs/metrics.md)")
      ->envname("FREEFLOW_METRICS_ADDRESS");
  app.add_option("--cri-endpoint", c.cri_endpoint,
                 "the container runtime's CRI socket, asked for pods' namespaces and names "
                 "(e.g. /run/containerd/containerd.sock; none if empty; docs/metrics.md)")
      ->envname("FREEFLOW_CRI_ENDPOINT");
  app.add_option("--log-level", c.log_level, "trace|debug|info|warn|error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
}

// TLS and authentication towards etcd, named as etcdctl names them (its flags without the
// "etcd-", and its ETCDCTL_* environment).
void AddEtcdFlags(CLI::App& app, RouterConfig& c, Raw& raw) {
  app.add_option("--etcd-cacert", c.etcd.cacert, "etcd: CA bundle to verify etcd's certificate")
      ->envname("ETCDCTL_CACERT");
  app.add_option("--etcd-cert", c.etcd.cert, "etcd: client certificate (with --etcd-key)")
      ->envname("ETCDCTL_CERT");
  app.add_option("--etcd-key", c.etcd.key, "etcd: client certificate's private key")
      ->envname("ETCDCTL_KEY");
  app.add_option("--etcd-user", raw.etcd_user, "etcd: USER[:PASSWORD] to authenticate as")
      ->envname("ETCDCTL_USER");
  app.add_option("--etcd-password", c.etcd.password,
                 "etcd: the user's password (better: ETCDCTL_PASSWORD, not in ps)")
      ->envname("ETCDCTL_PASSWORD");
}

// --etcd-user USER:PASSWORD, as etcdctl's --user: with a password given apart, the whole
// value is the user name.
void SplitEtcdUser(const Raw& raw, RouterConfig* c) {
  c->etcd.user = raw.etcd_user;
  const auto colon = raw.etcd_user.find(':');
  if (c->etcd.password.empty() && colon != std::string::npos) {
    c->etcd.user = raw.etcd_user.substr(0, colon);
    c->etcd.password = raw.etcd_user.substr(colon + 1);
  }
  const bool any = !c->etcd.cacert.empty() || !c->etcd.cert.empty() || !c->etcd.key.empty() ||
                   !c->etcd.user.empty() || !c->etcd.password.empty();
  if (any && !c->control_plane.starts_with("etcd:"))
    spdlog::warn("etcd TLS or user options are set but the control plane is not etcd:; ignored");
}

// --direct-ports LO-HI: 1 <= LO <= HI <= 65535. false + *error.
bool ParsePortRange(const std::string& text, uint16_t* lo, uint16_t* hi, std::string* error) {
  unsigned a = 0, b = 0;
  char tail = 0;
  if (std::sscanf(text.c_str(), "%u-%u%c", &a, &b, &tail) != 2 || a == 0 || a > b || b > 65535 ||
      text.find_first_not_of("0123456789-") != std::string::npos) {
    *error = "--direct-ports '" + text +
             "' is not a port range LO-HI with 1 <= LO <= HI <= 65535 (e.g. 20000-20999)";
    return false;
  }
  *lo = static_cast<uint16_t>(a);
  *hi = static_cast<uint16_t>(b);
  return true;
}

// The direct path's flags (docs/direct-path.md). false + *error.
bool ValidateDirect(const Raw& raw, RouterConfig* c, std::string* error) {
  c->direct_path = raw.cross_node_path == "direct";
  c->direct_seal = raw.direct_seal == "authenticate" ? SealMode::kAuthenticate : SealMode::kEncrypt;
  return ParsePortRange(raw.direct_ports, &c->direct_port_lo, &c->direct_port_hi, error);
}

// Turns the flags into a configuration. false + *error (a sentence a person can act on).
bool Validate(const Raw& raw, RouterConfig* c, std::string* error) {
  if (raw.prefix.empty()) {
    *error = "no overlay prefix: pass --vnet-prefix or set VNET_PREFIX (e.g. 10.244.0.0/16)";
    return false;
  }
  auto overlay = Ipv4Prefix::Parse(raw.prefix);
  if (!overlay) {
    *error = "--vnet-prefix '" + raw.prefix + "' is not an IPv4 prefix like 10.244.0.0/16";
    return false;
  }
  c->overlay = *overlay;
  if (raw.library.empty()) {
    *error = "cannot find libffverbs.so next to ffrouter; pass --library PATH";
    return false;
  }
  c->library_source = raw.library;
  c->socket_library_source = raw.socket_library;
  c->port = static_cast<uint16_t>(raw.port);
  if (!raw.host_ip.empty()) {
    auto ip = ParseIpv4(raw.host_ip);
    if (!ip) {
      *error = "--host-ip '" + raw.host_ip + "' is not an IPv4 address";
      return false;
    }
    c->host_ip = *ip;
  } else if (!raw.host_prefix.empty()) {
    auto p = Ipv4Prefix::Parse(raw.host_prefix);
    if (!p) {
      *error = "HOST_IP_PREFIX '" + raw.host_prefix + "' is not an IPv4 prefix";
      return false;
    }
    c->host_ip = AddressIn(*p);
    if (c->host_ip == 0) {
      *error = "no local address inside HOST_IP_PREFIX " + p->ToString();
      return false;
    }
  }
  SplitEtcdUser(raw, c);
  if (!ValidateDirect(raw, c, error)) return false;
  if (!c->control_plane.empty() && c->host_ip == 0) {
    *error =
        "--control-plane needs this node's address: pass --host-ip, or set HOST_IP or "
        "HOST_IP_PREFIX";
    return false;
  }
  return true;
}

}  // namespace

std::optional<RouterConfig> ParseOptions(int argc, char** argv, int* exit_code) {
  CLI::App app{"ffrouter: per-node freeflow router (virtual RDMA for containers)"};
  app.set_version_flag("--version", ff::VersionLine("ffrouter"));
  RouterConfig config;
  char host[HOST_NAME_MAX + 1] = {};
  ::gethostname(host, sizeof(host) - 1);
  config.node_name = host;
  Raw raw;
  AddFlags(app, config, raw);
  AddEtcdFlags(app, config, raw);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    *exit_code = app.exit(e);
    return std::nullopt;
  }
  std::string error;
  if (!Validate(raw, &config, &error)) {
    spdlog::error("{}", error);
    *exit_code = 2;
    return std::nullopt;
  }
  for (const QuotaSpec& q : kQuotaSpecs) {
    config.quotas_given[static_cast<size_t>(q.quota)] =
        app.get_option(std::string("--max-") + q.name + "-per-pod")->count() > 0;
  }
  return config;
}

namespace {

// A router serves many pods from one process: take every descriptor the hard limit allows.
// Returns the (soft) limit, RLIM_INFINITY when there is none.
uint64_t RaiseDescriptorLimit() {
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) != 0) return RLIM_INFINITY;
  if (r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &r) != 0) ::getrlimit(RLIMIT_NOFILE, &r);
  }
  return r.rlim_cur;
}

constexpr uint64_t kMiB = 1u << 20;
constexpr std::array kByteQuotas = {Quota::kQueuedBytes, Quota::kReadBytes, Quota::kProxies};

// Bytes one unit of a byte quota's flag costs when the pod stalls at it.
uint64_t StalledUnitBytes(Quota q) { return q == Quota::kProxies ? kProxyRingBytes : kMiB; }

uint32_t MinimumOf(Quota q) {
  switch (q) {
    case Quota::kQueuedBytes:
      return kMinPodQueuedMiB;
    case Quota::kReadBytes:
      return kMinPodReadMiB;
    default:
      return kMinPodProxies;
  }
}

// Fits the byte quotas to the memory cgroup's limit, saying what it chose or why it cannot.
void FitMemory(RouterConfig& config) {
  const std::optional<uint64_t> limit = ProcessMemoryLimit();
  const MemoryQuotaFit fit = FitMemoryQuotas(limit, config.pod_limits, config.quotas_given);
  const auto at = [&](Quota q) { return fit.limits[static_cast<size_t>(q)]; };
  const uint64_t need = kPodsPerNode * StalledPodBytes(fit.limits) + kMemoryReserve;
  if (!fit.fits) {
    spdlog::warn(
        "memory limit {} MiB is below what {} pods stalled at their byte quotas need ({} MiB: "
        "{} MiB queued, {} MiB of READ data and {} proxies each); raise the router's memory "
        "limit or lower --max-queued-mib-per-pod, --max-read-mib-per-pod, --max-proxies-per-pod",
        *limit / kMiB, kPodsPerNode, need / kMiB, at(Quota::kQueuedBytes), at(Quota::kReadBytes),
        at(Quota::kProxies));
  } else if (fit.limits != config.pod_limits) {
    spdlog::info(
        "memory limit {} MiB: each pod may queue {} MiB, have {} MiB of READ data in flight and "
        "hold {} proxies (quotas not given lowered so that {} pods stalled at once fit)",
        *limit / kMiB, at(Quota::kQueuedBytes), at(Quota::kReadBytes), at(Quota::kProxies),
        kPodsPerNode);
  }
  config.pod_limits = fit.limits;
}

}  // namespace

uint64_t StalledPodBytes(const PodLimits& limits) {
  uint64_t bytes = 0;
  for (const Quota q : kByteQuotas) bytes += limits[static_cast<size_t>(q)] * StalledUnitBytes(q);
  return bytes;
}

MemoryQuotaFit FitMemoryQuotas(std::optional<uint64_t> limit, const PodLimits& limits,
                               const QuotasGiven& given) {
  if (!limit) return {limits, true};
  const uint64_t budget = (*limit - std::min(*limit, kMemoryReserve)) / kPodsPerNode;
  if (StalledPodBytes(limits) <= budget) return {limits, true};
  // What the quotas given cost stays; the defaults share what is left in proportion.
  uint64_t fixed = 0;
  uint64_t scalable = 0;
  for (const Quota q : kByteQuotas) {
    const size_t i = static_cast<size_t>(q);
    (given[i] ? fixed : scalable) += limits[i] * StalledUnitBytes(q);
  }
  if (scalable == 0) return {limits, false};
  const uint64_t room = budget - std::min(budget, fixed);
  PodLimits fitted = limits;
  for (const Quota q : kByteQuotas) {
    const size_t i = static_cast<size_t>(q);
    if (given[i]) continue;
    const uint64_t scaled =
        static_cast<uint64_t>(static_cast<long double>(limits[i]) * static_cast<long double>(room) /
                              static_cast<long double>(scalable));
    fitted[i] = static_cast<uint32_t>(
        std::max<uint64_t>(MinimumOf(q), std::min<uint64_t>(scaled, limits[i])));
  }
  return {fitted, StalledPodBytes(fitted) <= budget};
}

FdQuotaFit FitFdQuota(uint64_t nofile, uint32_t quota, bool given) {
  const auto need = [](uint64_t q) { return kPodsPerNode * q + kFdReserve; };
  if (nofile == RLIM_INFINITY || need(quota) <= nofile) return {quota, true};
  if (given) return {quota, false};
  const uint64_t fit = (nofile - std::min(nofile, kFdReserve)) / kPodsPerNode;
  if (fit >= kMinPodFds) return {static_cast<uint32_t>(fit), true};
  return {kMinPodFds, false};
}

void ApplyProcessOptions(RouterConfig& config) {
  spdlog::set_level(spdlog::level::from_str(config.log_level));
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ ffrouter: %v");
  const uint64_t nofile = RaiseDescriptorLimit();
  const bool fds_given = config.quotas_given[static_cast<size_t>(Quota::kFds)];
  uint32_t& quota = config.pod_limits[static_cast<size_t>(Quota::kFds)];
  const FdQuotaFit fit = FitFdQuota(nofile, quota, fds_given);
  if (!fit.fits) {
    spdlog::warn(
        "descriptor limit {} is below what {} pods at {} descriptors each need ({}); raise the "
        "router's RLIMIT_NOFILE{}",
        nofile, kPodsPerNode, fit.quota, kPodsPerNode * fit.quota + kFdReserve,
        fds_given ? " or lower --max-fds-per-pod" : "");
  } else if (fit.quota != quota) {
    spdlog::info(
        "descriptor limit {}: each pod may hold {} descriptors in the router (--max-fds-per-pod "
        "not given; {} pods fit)",
        nofile, fit.quota, kPodsPerNode);
  }
  quota = fit.quota;
  FitMemory(config);
  if (config.realtime_priority > 0) {
    sched_param sp{};
    sp.sched_priority = static_cast<int>(config.realtime_priority);
    if (::sched_setscheduler(0, SCHED_RR, &sp) != 0) {
      spdlog::warn(
          "cannot switch to SCHED_RR priority {}: {} (needs CAP_SYS_NICE); "
          "continuing with normal scheduling",
          config.realtime_priority, std::strerror(errno));
    }
  }
}

}  // namespace ff::router
