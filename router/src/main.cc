// ffrouter: the per-node freeflow router daemon.
#include <limits.h>
#include <sched.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <ifaddrs.h>
#include <netinet/in.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "router.h"

namespace {

ff::router::Router* g_router = nullptr;

void OnSignal(int) {
  if (g_router != nullptr) g_router->Stop();
}

std::string EnvOr(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : fallback;
}

// The container library is built next to the router (build tree) or installed under
// ../lib/freeflow (install tree).
std::string DefaultLibrary() {
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "";
  for (const auto& candidate : {exe.parent_path() / "../verbs/libffverbs.so",
                                exe.parent_path() / "libffverbs.so",
                                exe.parent_path() / "../lib/freeflow/libffverbs.so"}) {
    if (std::filesystem::exists(candidate, ec)) return std::filesystem::canonical(candidate, ec);
  }
  return "";
}

// The first local IPv4 address inside `prefix` (the original DaemonSet's HOST_IP_PREFIX).
uint32_t AddressIn(const ff::Ipv4Prefix& prefix) {
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

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ffrouter: per-node freeflow router (virtual RDMA for containers)"};
  ff::router::RouterConfig config;
  config.dir = EnvOr("FREEFLOW_DIR", "/freeflow");
  config.name = EnvOr("FFR_NAME", "ffrouter");
  std::string prefix = EnvOr("VNET_PREFIX", "");
  std::string library = DefaultLibrary();
  std::string log_level = "info";
  config.control_plane = EnvOr("FREEFLOW_CONTROL_PLANE", "");
  char host[HOST_NAME_MAX + 1] = {};
  ::gethostname(host, sizeof(host) - 1);
  config.node_name = EnvOr("NODE_NAME", host);

  app.add_option("--dir", config.dir, "shared folder mounted into pods (env FREEFLOW_DIR)")
      ->capture_default_str();
  app.add_option("--name", config.name, "router name; socket is <dir>/<name>.sock (env FFR_NAME)")
      ->capture_default_str();
  app.add_option("--vnet-prefix", prefix, "overlay (pod) network prefix, e.g. 10.244.0.0/16 "
                 "(env VNET_PREFIX)");
  app.add_option("--library", library, "container library to install as <dir>/libffverbs.so")
      ->capture_default_str();
  app.add_option("--node-name", config.node_name, "node name reported to pods (env NODE_NAME)")
      ->capture_default_str();
  std::string host_ip = EnvOr("HOST_IP", "");
  std::string host_prefix = EnvOr("HOST_IP_PREFIX", "");
  int port = 7471;
  app.add_option("--host-ip", host_ip, "this node's address for router-to-router traffic (env "
                 "HOST_IP; or the first local address inside HOST_IP_PREFIX)");
  app.add_option("--host-ip-prefix", host_prefix, "pick the node address inside this prefix "
                 "(env HOST_IP_PREFIX)");
  app.add_option("--port", port, "router-to-router TCP port")->check(CLI::Range(1, 65535))
      ->capture_default_str();
  app.add_option("--control-plane", config.control_plane,
                 "where pods live: static:FILE or etcd:URL[,URL..]; empty = this node only "
                 "(env FREEFLOW_CONTROL_PLANE)");
  app.add_option("--peer-timeout-ms", config.peer_timeout_ms,
                 "declare a silent peer router dead after this long; its QPs fail")
      ->check(CLI::Range(100, 600000))
      ->capture_default_str();
  app.add_option("--resolve-timeout-ms", config.resolve_timeout_ms,
                 "how long a connect waits for the control plane to learn an unknown pod")
      ->check(CLI::Range(0, 60000))
      ->capture_default_str();
  app.add_option("--poll-us", config.poll_us,
                 "while cross-node traffic flows, poll instead of sleeping for this many "
                 "microseconds after the last activity (0: always sleep)")
      ->check(CLI::Range(0, 100000))
      ->capture_default_str();
  int realtime = 0;
  app.add_option("--realtime-priority", realtime,
                 "run under SCHED_RR at this priority (1-99) so that spinning pods cannot "
                 "starve cross-node forwarding; 0 = normal scheduling")
      ->check(CLI::Range(0, 99))
      ->capture_default_str();
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  spdlog::set_level(spdlog::level::from_str(log_level));
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ ffrouter: %v");
  if (prefix.empty()) {
    spdlog::error("no overlay prefix: pass --vnet-prefix or set VNET_PREFIX (e.g. 10.244.0.0/16)");
    return 2;
  }
  auto parsed = ff::Ipv4Prefix::Parse(prefix);
  if (!parsed) {
    spdlog::error("--vnet-prefix '{}' is not an IPv4 prefix like 10.244.0.0/16", prefix);
    return 2;
  }
  config.overlay = *parsed;
  if (library.empty()) {
    spdlog::error("cannot find libffverbs.so next to ffrouter; pass --library PATH");
    return 2;
  }
  config.library_source = library;
  config.port = static_cast<uint16_t>(port);
  if (!host_ip.empty()) {
    auto ip = ff::ParseIpv4(host_ip);
    if (!ip) {
      spdlog::error("--host-ip '{}' is not an IPv4 address", host_ip);
      return 2;
    }
    config.host_ip = *ip;
  } else if (!host_prefix.empty()) {
    auto p = ff::Ipv4Prefix::Parse(host_prefix);
    if (!p) {
      spdlog::error("HOST_IP_PREFIX '{}' is not an IPv4 prefix", host_prefix);
      return 2;
    }
    config.host_ip = AddressIn(*p);
    if (config.host_ip == 0) {
      spdlog::error("no local address inside HOST_IP_PREFIX {}", p->ToString());
      return 2;
    }
  }

  if (realtime > 0) {
    sched_param sp{};
    sp.sched_priority = realtime;
    if (::sched_setscheduler(0, SCHED_RR, &sp) != 0) {
      spdlog::warn("cannot switch to SCHED_RR priority {}: {} (needs CAP_SYS_NICE); "
                   "continuing with normal scheduling", realtime, std::strerror(errno));
    }
  }
  ff::router::Router router(config, ff::router::MakeNetnsIdentityResolver(*parsed));
  std::string error;
  if (!router.Start(&error)) {
    spdlog::error("{}", error);
    return 1;
  }
  g_router = &router;
  struct sigaction sa{};
  sa.sa_handler = OnSignal;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
  router.Run();
  g_router = nullptr;
  return 0;
}
