// The namespace and name of this node's pods, by overlay address, as the container runtime
// tells them over the Kubernetes CRI (runtime.v1 RuntimeService: ListPodSandbox, then
// PodSandboxStatus of each sandbox not seen before, for its address). The router knows a pod
// by its network namespace and address; this only names it for an admin (metrics, ffctl),
// never decides anything: what the runtime says is not an identity.
//
// Asked on a thread of its own (a runtime that hangs costs the loop nothing): every
// refresh period, and soon after Refresh() (a pod the router has not named yet appeared), at
// most once a second. Each call waits at most kCallTimeoutMs. A runtime that cannot be asked
// is logged once, and again when it answers.
// Threading: Find, Refresh and the figures from any thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace ff::router {

class PodNames {
 public:
  struct Name {
    std::string ns;
    std::string pod;
    bool operator==(const Name&) const = default;
  };
  static constexpr int kCallTimeoutMs = 2000;
  static constexpr uint64_t kDefaultRefreshNs = 30'000'000'000ull;
  static constexpr uint64_t kMinAskIntervalNs = 1'000'000'000ull;
  // At most this many sandboxes are looked at (a node runs a few hundred pods).
  static constexpr size_t kMaxSandboxes = 4096;

  // Asks the runtime at `endpoint` (a Unix socket path, e.g. /run/containerd/containerd.sock).
  explicit PodNames(std::string endpoint, uint64_t refresh_ns = kDefaultRefreshNs);
  ~PodNames();
  PodNames(const PodNames&) = delete;
  PodNames& operator=(const PodNames&) = delete;

  // The name of the pod with address `ip` (host order) at the runtime's last answer.
  std::optional<Name> Find(uint32_t ip) const;
  void Refresh();
  // Answers the runtime gave, and asks that failed, since start.
  uint64_t answers() const;
  uint64_t failures() const;

 private:
  struct Runtime;  // the gRPC stub (pod_names.cc)
  void Run();
  // One round: the sandboxes, then the status of those not seen before. false + *error.
  bool Ask(std::string* error);

  const std::string endpoint_;
  const uint64_t refresh_ns_;
  std::unique_ptr<Runtime> runtime_;
  // The thread's own: sandbox id -> its address and name, from the status asked once.
  struct Known {
    uint32_t ip = 0;
    Name name;
  };
  std::map<std::string, Known> known_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool kicked_ = false;
  std::map<uint32_t, Name> by_ip_;
  uint64_t answers_ = 0;
  uint64_t failures_ = 0;
  std::thread thread_;  // last: it starts once everything above is there
};

}  // namespace ff::router
