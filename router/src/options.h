// ffrouter's configuration: command-line flags with the environment variables the original
// FreeFlow DaemonSet sets (VNET_PREFIX, FFR_NAME, HOST_IP, HOST_IP_PREFIX, NODE_NAME), parsed
// and validated before anything starts.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "base/quotas.h"
#include "freeflow/controlplane.h"
#include "freeflow/frame_seal.h"
#include "freeflow/ipv4.h"
#include "freeflow/router_socket.h"
#include "freeflow/tunables.h"

namespace ff::router {

struct RouterConfig {
  std::string dir = kDefaultFreeflowDir;  // the host folder mounted into pods
  std::string name = kDefaultRouterName;  // socket <dir>/<name>.sock (router_socket.h)
  Ipv4Prefix overlay;                     // pod addresses
  std::string library_source;             // copied to <dir>/libffverbs.so at start; empty: skip
  std::string socket_library_source;      // copied to <dir>/libfsocket.so; empty: no TCP mode
  std::string node_name;
  // Cross-node: this node's underlay address and router-to-router port; an empty control
  // plane spec means this node only (no listener, no remote peers).
  uint32_t host_ip = 0;  // host byte order
  uint16_t port = kDefaultRouterPort;
  std::string control_plane;
  cp::EtcdSecurity etcd;  // --etcd-cacert, --etcd-cert, --etcd-key, --etcd-user, --etcd-password
  // Node links: TLS 1.3 with these (a Kubernetes TLS Secret's keys, mounted by the
  // DaemonSet), unless insecure_node_links (plaintext, for benchmarks; logged loudly).
  std::string tls_ca = std::string(kDefaultTlsDir) + "/ca.crt";
  std::string tls_cert = std::string(kDefaultTlsDir) + "/tls.crt";
  std::string tls_key = std::string(kDefaultTlsDir) + "/tls.key";
  bool insecure_node_links = false;
  // When another router holds the host folder: ask it for its state and serve its pods on
  // (docs/handover.md), rather than exit. A router started by mistake beside a running one
  // must not take its pods: the DaemonSet's rolling update asks for it.
  bool take_over = false;
  // How long a router that may take over asks again (every few seconds) while the one that
  // serves refuses; 0: once. It takes the folder as a first router does if the other stops.
  uint32_t take_over_wait_s = 0;
  // A file that exists while this router serves (its pid in it), for a readiness probe that
  // must tell the serving router from a successor still waiting; empty: none.
  std::string ready_file;
  uint32_t peer_timeout_ms = kDefaultPeerTimeoutMs;  // a silent peer router is dead after this
  uint32_t poll_us = 0;                              // poll proxies this long after traffic
  uint32_t spin_us = kDefaultRouterSpinUs;           // poll this long after answering a pod
  uint32_t cm_spin_us = kDefaultRouterCmSpinUs;      // ... after a local rdma_cm event
  uint32_t resolve_timeout_ms =
      kDefaultResolveTimeoutMs;    // a connect waits this long for an unknown pod
  uint32_t realtime_priority = 0;  // SCHED_RR priority; 0: normal scheduling
  // Serve processes in the router's own network namespace (host networking); see
  // docs/security.md, "Pod identity". Off: they are refused.
  bool allow_host_network_clients = false;
  // Across nodes: direct connections between the pod processes (docs/direct-path.md), or
  // the relay through the two routers. Direct is asked for and answered only when both
  // routers run it; a router in relay mode answers every connect with the relay.
  bool direct_path = true;                          // --cross-node-path=direct (default)
  uint16_t direct_port_lo = kDefaultDirectPortLo;   // --direct-ports: where listeners bind
  uint16_t direct_port_hi = kDefaultDirectPortHi;
  SealMode direct_seal = SealMode::kEncrypt;        // --direct-seal
  // UD QPs' datagrams over direct connections too (--direct-datagrams); off: they stay
  // relayed (docs/direct-path.md says why it is not the default yet).
  bool direct_datagrams = false;
  std::string log_level = "info";
  // Prometheus /metrics ("host:port"; docs/metrics.md); empty: not served.
  std::string metrics_address;
  // The container runtime's CRI socket, asked for pods' names (--cri-endpoint); empty: none.
  std::string cri_endpoint;
  PodLimits pod_limits = DefaultPodLimits();         // --max-*-per-pod
  QuotasGiven quotas_given{};                        // which were set (flag or variable)
  uint64_t hello_timeout_ns = kHelloTimeoutNs;       // not a flag: tests shorten it
  uint64_t stream_gc_period_ns = kStreamGcPeriodNs;  // likewise (TCP-mode record sweeps)
  uint64_t stream_unseen_grace_ns = kStreamUnseenGraceNs;
  uint64_t direct_accept_timeout_ns = kDirectAcceptTimeoutNs;  // likewise (direct listeners)
  uint64_t resume_grace_ns = kResumeGraceNs;  // likewise (channels of a replaced router)
};

// Parses and validates the command line and environment. On failure (or --help) returns
// std::nullopt with the process exit code in *exit_code, after printing why.
std::optional<RouterConfig> ParseOptions(int argc, char** argv, int* exit_code);

// The per-pod descriptor quota a router with descriptor limit `nofile` (RLIM_INFINITY: none)
// applies, given the configured `quota` and whether it was set (`given`): kPodsPerNode pods
// at their quota, plus kFdReserve, must fit the limit, so that no pod can take the
// descriptors another pod's quota promises. A quota given is kept as it is; the default is
// lowered to what fits, but not below kMinPodFds. `fits` is false when the quota applied
// does not fit (the router warns).
struct FdQuotaFit {
  uint32_t quota;
  bool fits;
};
FdQuotaFit FitFdQuota(uint64_t nofile, uint32_t quota, bool given);

// What one pod stalled at its byte quotas makes the router hold at once: its queued bytes,
// its READ data in flight and the response rings of its proxies.
uint64_t StalledPodBytes(const PodLimits& limits);

// The byte quotas a router with memory limit `limit` (std::nullopt: none) applies: kPodsPerNode
// pods stalled at once (StalledPodBytes), plus kMemoryReserve, must fit the limit, so that no
// pod can take the memory another pod's quotas promise. Quotas given are kept as they are;
// the queued, READ and proxy quotas left at their defaults are scaled down together to what
// fits beside them, but not below kMinPodQueuedMiB, kMinPodReadMiB and kMinPodProxies.
// `fits` is false when the quotas applied do not fit (the router warns).
struct MemoryQuotaFit {
  PodLimits limits;
  bool fits;
};
MemoryQuotaFit FitMemoryQuotas(std::optional<uint64_t> limit, const PodLimits& limits,
                               const QuotasGiven& given);

// Applies the process-wide settings of `config`: log level and format, scheduling, the
// descriptor limit (raised to the hard limit, and the descriptor quota fitted to it:
// FitFdQuota) and the memory limit (the byte quotas fitted to it: FitMemoryQuotas), with a
// warning for a quota that does not fit.
void ApplyProcessOptions(RouterConfig& config);

}  // namespace ff::router
