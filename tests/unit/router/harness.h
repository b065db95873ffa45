// Test harness for the router's components in one process, without root or namespaces:
// routers on their own threads joined by the in-memory node transport, an in-memory control
// plane, a fake identity resolver, and "raw pods" (tests/common/raw_pod.h) that speak the pod
// protocol themselves over a socketpair (what a hostile pod, or the library, would send).
#pragma once

#include <arpa/inet.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "freeflow/codec.h"
#include "freeflow/controlplane.h"
#include "freeflow/fd.h"
#include "freeflow/protocol.h"
#include "freeflow/ring.h"
#include "loopback_transport.h"
#include "raw_pod.h"
#include "router.h"

namespace ff::router::test {

uint32_t Ip(const char* dotted);  // host byte order

// The default per-pod limits with some changed (in flag units: MiB for byte quotas).
PodLimits WithLimits(std::initializer_list<std::pair<Quota, uint32_t>> changed);

// Hands out the overlay address (and network namespace) of each adopted connection, in
// adoption order.
class FakeIdentity final : public IdentityResolver {
 public:
  void Expect(uint32_t ip, uint64_t netns = 0);
  bool Resolve(int sock, PodIdentity* out, std::string* error) override;
  size_t Calls();  // how many times Resolve ran
  // The next Resolve closes `client` (the other end of the connection it resolves) and
  // refuses: a probe that hangs up while the router identifies it.
  void HangUpDuringResolve(UniqueFd client);

 private:
  std::mutex mu_;
  std::deque<std::pair<uint32_t, uint64_t>> next_;
  size_t calls_ = 0;
  UniqueFd hang_up_;
};

// Stands in for sock_diag: the test says which TCP connections exist in which pod's
// namespace (a pod is its address and namespace here); every other connection is gone.
class FakeStreamProbe final : public TcpModeProbe {
 public:
  // From now on, connection `t` is `p` in the namespace of pod (ip, netns).
  void Set(uint32_t ip, uint64_t netns, const TcpTuple& t, Presence p);
  // Opening a handle fails with `error` from now on (empty: it succeeds again).
  void FailOpen(const std::string& error);
  size_t looks();  // questions asked so far
  // Questions asked so far about connection `t` in the namespace of pod (ip, netns).
  size_t looks(uint32_t ip, uint64_t netns, const TcpTuple& t);
  static size_t handles();  // handles alive (in every router of the process)

  std::shared_ptr<NetnsHandle> Open(int sock, const PodIdentity& who, std::string* error) override;
  Presence Look(NetnsHandle& ns, const TcpTuple& t) override;

 private:
  using Where = std::tuple<uint32_t, uint64_t, uint32_t, uint16_t, uint32_t, uint16_t>;
  std::mutex mu_;
  std::map<Where, Presence> table_;
  std::map<Where, size_t> asked_;
  std::string fail_open_;
  size_t looks_ = 0;
};

// Where pods live, shared by the routers of one test (an in-memory etcd).
class FakeCluster {
 public:
  std::unique_ptr<cp::ControlPlane> PlaneFor(const cp::Endpoint& self);
  void Set(uint32_t ip, const cp::Endpoint& ep);
  void Erase(uint32_t ip);
  std::optional<cp::Endpoint> Lookup(uint32_t ip) const;

 private:
  mutable std::mutex mu_;
  std::map<uint32_t, cp::Endpoint> where_;
};

// One router with its own temporary host folder, serving on its own thread.
class TestRouter {
 public:
  struct Options {
    std::string node = "node-a";
    uint32_t host_ip = 0;                // with a network: this router's endpoint address
    LoopbackNetwork* network = nullptr;  // nullptr: this node only
    FakeCluster* cluster = nullptr;
    uint32_t resolve_timeout_ms = 300;
    PodLimits limits = DefaultPodLimits();
    uint64_t hello_timeout_ns = kHelloTimeoutNs;
    uint64_t stream_gc_period_ns = kStreamGcPeriodNs;
    uint64_t stream_unseen_grace_ns = kStreamUnseenGraceNs;
    uint32_t spin_us = kDefaultRouterSpinUs;
    uint32_t cm_spin_us = kDefaultRouterCmSpinUs;
    std::string overlay = "10.0.0.0/8";  // pod addresses
    // --cross-node-path=direct; its listeners bind any port the kernel picks (0..0) unless
    // told, and wait direct_accept_timeout_ns for their connection.
    bool direct = false;
    SealMode direct_seal = SealMode::kEncrypt;
    bool direct_datagrams = true;  // --direct-datagrams
    uint16_t direct_port_lo = 0, direct_port_hi = 0;
    uint64_t direct_accept_timeout_ns = kDirectAcceptTimeoutNs;
    uint64_t resume_grace_ns = kResumeGraceNs;  // channels of a replaced peer router
    std::string metrics_address;  // --metrics-address; empty: none
    std::string cri_endpoint;     // --cri-endpoint; empty: none
  };
  explicit TestRouter(Options options);
  ~TestRouter();
  // Connects a new client socket as a pod with overlay address `ip`, in network namespace
  // `netns` (0: the one all tests share).
  UniqueFd Connect(uint32_t ip, uint64_t netns = 0);
  // What a health probe does: connects and hangs up before the router serves it (with
  // `first`, after sending it). Were it identified, it would be refused (no address).
  void ConnectAndHangUp(const std::string& first = "");
  // Connects, and hangs up while the router identifies the connection (and refuses it).
  void ConnectAndHangUpDuringIdentification();
  size_t IdentityCalls() { return identity_->Calls(); }
  uint16_t MetricsPort() const { return router_->metrics_port(); }
  // Runs `fn` on the router's thread (it may block it, as a stalled loop would).
  void Post(std::function<void()> fn) { router_->Post(std::move(fn)); }
  FakeStreamProbe& streams() { return *streams_; }
  cp::Endpoint endpoint() const { return {options_.node, options_.host_ip, 7471}; }
  const std::string& dir() const { return dir_; }
  // Router::StatsLine, taken on the router's thread.
  std::string Stats();
  // One figure of Stats() ("qps", "fds", ...).
  uint64_t Stat(const std::string& name);
  // CPU time the router's thread has used, in nanoseconds.
  uint64_t CpuNs();
  // Time the router's thread has been runnable (running, or waiting for a CPU: its
  // schedstat), in nanoseconds: a thread that polls counts all of it even on a machine
  // busy enough that it gets only part of a CPU.
  uint64_t AwakeNs();

 private:
  Options options_;
  std::string dir_;
  FakeIdentity* identity_ = nullptr;    // owned by the router
  FakeStreamProbe* streams_ = nullptr;  // likewise
  std::unique_ptr<Router> router_;
  std::thread thread_;
  pid_t router_tid_ = 0;  // the router thread's, for its schedstat
};

// The raw pod client is tests/common/raw_pod.h; a RawPod here is one connected to a
// TestRouter (or over any client socket).
using ff::test::NextAnswer;
using ff::test::NextPayload;
using ff::test::NextRecord;
using ff::test::NextUdRing;
using ff::test::PassMessage;
using ff::test::PostRequest;
using ff::test::PostSend;
using ff::test::RawLink;
using ff::test::RawQp;
using ff::test::TryPostRequest;
using ff::test::WaitFor;
using ff::test::WriteMessage;

class RawPod : public ff::test::RawPod {
 public:
  using ff::test::RawPod::RawPod;  // a client socket connected some other way
  // A pod with overlay address `ip` in network namespace `netns` (TestRouter::Connect).
  RawPod(TestRouter& router, uint32_t ip, uint64_t netns = 0)
      : ff::test::RawPod(router.Connect(ip, netns)) {}
};

}  // namespace ff::router::test
