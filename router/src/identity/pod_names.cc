#include "identity/pod_names.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <set>

#include "cri_runtime.grpc.pb.h"
#include "freeflow/clock.h"
#include "freeflow/ipv4.h"

namespace ff::router {

struct PodNames::Runtime {
  std::unique_ptr<runtime::v1::RuntimeService::Stub> stub;
};

PodNames::PodNames(std::string endpoint, uint64_t refresh_ns)
    : endpoint_(std::move(endpoint)), refresh_ns_(refresh_ns), runtime_(new Runtime) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(16 << 20);
  runtime_->stub = runtime::v1::RuntimeService::NewStub(
      grpc::CreateCustomChannel("unix:" + endpoint_, grpc::InsecureChannelCredentials(), args));
  thread_ = std::thread([this] { Run(); });
}

PodNames::~PodNames() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::optional<PodNames::Name> PodNames::Find(uint32_t ip) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = by_ip_.find(ip);
  if (it == by_ip_.end()) return std::nullopt;
  return it->second;
}

void PodNames::Refresh() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    kicked_ = true;
  }
  cv_.notify_all();
}

uint64_t PodNames::answers() const {
  std::lock_guard<std::mutex> lock(mu_);
  return answers_;
}

uint64_t PodNames::failures() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failures_;
}

namespace {

std::chrono::system_clock::time_point Deadline() {
  return std::chrono::system_clock::now() + std::chrono::milliseconds(PodNames::kCallTimeoutMs);
}

}  // namespace

bool PodNames::Ask(std::string* error) {
  runtime::v1::ListPodSandboxRequest list;
  list.mutable_filter()->mutable_state()->set_state(runtime::v1::SANDBOX_READY);
  runtime::v1::ListPodSandboxResponse sandboxes;
  grpc::ClientContext context;
  context.set_deadline(Deadline());
  const grpc::Status s = runtime_->stub->ListPodSandbox(&context, list, &sandboxes);
  if (!s.ok()) {
    *error = "ListPodSandbox: " + s.error_message();
    return false;
  }
  std::set<std::string> seen;
  for (const runtime::v1::PodSandbox& sandbox : sandboxes.items()) {
    if (seen.size() >= kMaxSandboxes) break;
    seen.insert(sandbox.id());
    if (known_.count(sandbox.id()) != 0) continue;
    runtime::v1::PodSandboxStatusRequest ask;
    ask.set_pod_sandbox_id(sandbox.id());
    runtime::v1::PodSandboxStatusResponse status;
    grpc::ClientContext status_context;
    status_context.set_deadline(Deadline());
    const grpc::Status t = runtime_->stub->PodSandboxStatus(&status_context, ask, &status);
    if (!t.ok()) continue;  // gone meanwhile: the next round forgets it
    // A sandbox without an IPv4 address (none, or IPv6 only) is kept as 0: named by nothing.
    known_[sandbox.id()] = {ParseIpv4(status.status().network().ip()).value_or(0),
                            {sandbox.metadata().namespace_(), sandbox.metadata().name()}};
  }
  std::map<uint32_t, Name> by_ip;
  for (auto it = known_.begin(); it != known_.end();) {
    if (seen.count(it->first) == 0) {
      it = known_.erase(it);
      continue;
    }
    if (it->second.ip != 0) by_ip[it->second.ip] = it->second.name;
    ++it;
  }
  std::lock_guard<std::mutex> lock(mu_);
  by_ip_ = std::move(by_ip);
  return true;
}

void PodNames::Run() {
  bool failing = false;
  for (;;) {
    std::string error;
    const bool ok = Ask(&error);
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++(ok ? answers_ : failures_);
    }
    if (!ok && !failing) {
      spdlog::info("the container runtime at {} names no pods ({}): pods are shown by address",
                   endpoint_, error);
    } else if (ok && failing) {
      spdlog::info("the container runtime at {} names pods again", endpoint_);
    }
    failing = !ok;
    const uint64_t asked = MonotonicNs();
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::nanoseconds(refresh_ns_), [&] { return stop_ || kicked_; });
    if (stop_) return;
    // A kick asks again, but not sooner than kMinAskIntervalNs after the last round.
    const uint64_t since = MonotonicNs() - asked;
    if (kicked_ && since < kMinAskIntervalNs) {
      cv_.wait_for(lock, std::chrono::nanoseconds(kMinAskIntervalNs - since),
                   [&] { return stop_; });
      if (stop_) return;
    }
    kicked_ = false;
  }
}

}  // namespace ff::router
