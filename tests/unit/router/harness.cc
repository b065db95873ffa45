#include "harness.h"

#include <pthread.h>
#include <spdlog/spdlog.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <stdexcept>

namespace ff::router::test {
namespace {

// Router logs only when a test asks for them (FF_TEST_LOG=debug|info).
const bool kQuietLogs = [] {
  const char* level = std::getenv("FF_TEST_LOG");
  spdlog::set_level(level != nullptr ? spdlog::level::from_str(level) : spdlog::level::err);
  return true;
}();

class FakeControlPlane final : public cp::ControlPlane {
 public:
  FakeControlPlane(FakeCluster& cluster, cp::Endpoint self) : cluster_(cluster), self_(self) {}
  void Publish(uint32_t ip) override { cluster_.Set(ip, self_); }
  void Withdraw(uint32_t ip) override {
    if (auto ep = cluster_.Lookup(ip); ep && *ep == self_) cluster_.Erase(ip);
  }
  std::optional<cp::Endpoint> Lookup(uint32_t ip) const override { return cluster_.Lookup(ip); }
  std::vector<cp::Endpoint> Nodes() const override { return {}; }
  void OnChange(std::function<void()>) override {}
  bool Start(std::string*) override { return true; }
  bool Healthy() const override { return true; }

 private:
  FakeCluster& cluster_;
  cp::Endpoint self_;
};

}  // namespace

uint32_t Ip(const char* dotted) { return *ParseIpv4(dotted); }

PodLimits WithLimits(std::initializer_list<std::pair<Quota, uint32_t>> changed) {
  PodLimits l = DefaultPodLimits();
  for (const auto& [quota, n] : changed) l[static_cast<size_t>(quota)] = n;
  return l;
}

void FakeIdentity::Expect(uint32_t ip, uint64_t netns) {
  std::lock_guard<std::mutex> g(mu_);
  next_.emplace_back(ip, netns);
}

void FakeIdentity::HangUpDuringResolve(UniqueFd client) {
  std::lock_guard<std::mutex> g(mu_);
  hang_up_ = std::move(client);
}

bool FakeIdentity::Resolve(int, PodIdentity* out, std::string* error) {
  std::lock_guard<std::mutex> g(mu_);
  ++calls_;
  if (hang_up_) {
    hang_up_.reset();
    *error = "it runs in the router's own network namespace (host network)";
    return false;
  }
  if (next_.empty() || next_.front().first == 0) {
    if (!next_.empty()) next_.pop_front();
    *error = "the process has no address inside the overlay prefix 10.0.0.0/8";
    return false;
  }
  out->pid = ::getpid();
  out->ip = next_.front().first;
  out->netns = next_.front().second;
  next_.pop_front();
  return true;
}

size_t FakeIdentity::Calls() {
  std::lock_guard<std::mutex> g(mu_);
  return calls_;
}

namespace {

std::atomic<size_t> live_fake_handles{0};

struct FakeHandle final : NetnsHandle {
  FakeHandle(uint32_t ip, uint64_t netns) : ip(ip), netns(netns) { ++live_fake_handles; }
  ~FakeHandle() override { --live_fake_handles; }
  uint32_t ip;
  uint64_t netns;
};

}  // namespace

void FakeStreamProbe::Set(uint32_t ip, uint64_t netns, const TcpTuple& t, Presence p) {
  std::lock_guard<std::mutex> g(mu_);
  table_[{ip, netns, t.local_ip, t.local_port, t.remote_ip, t.remote_port}] = p;
}

void FakeStreamProbe::FailOpen(const std::string& error) {
  std::lock_guard<std::mutex> g(mu_);
  fail_open_ = error;
}

size_t FakeStreamProbe::looks() {
  std::lock_guard<std::mutex> g(mu_);
  return looks_;
}

size_t FakeStreamProbe::looks(uint32_t ip, uint64_t netns, const TcpTuple& t) {
  std::lock_guard<std::mutex> g(mu_);
  auto it = asked_.find({ip, netns, t.local_ip, t.local_port, t.remote_ip, t.remote_port});
  return it == asked_.end() ? 0 : it->second;
}

size_t FakeStreamProbe::handles() { return live_fake_handles; }

std::shared_ptr<NetnsHandle> FakeStreamProbe::Open(int, const PodIdentity& who,
                                                   std::string* error) {
  std::lock_guard<std::mutex> g(mu_);
  if (!fail_open_.empty()) {
    *error = fail_open_;
    return nullptr;
  }
  return std::make_shared<FakeHandle>(who.ip, who.netns);
}

Presence FakeStreamProbe::Look(NetnsHandle& ns, const TcpTuple& t) {
  const auto& h = static_cast<FakeHandle&>(ns);
  std::lock_guard<std::mutex> g(mu_);
  ++looks_;
  const Where where{h.ip, h.netns, t.local_ip, t.local_port, t.remote_ip, t.remote_port};
  ++asked_[where];
  auto it = table_.find(where);
  return it == table_.end() ? Presence::kGone : it->second;
}

std::unique_ptr<cp::ControlPlane> FakeCluster::PlaneFor(const cp::Endpoint& self) {
  return std::make_unique<FakeControlPlane>(*this, self);
}

void FakeCluster::Set(uint32_t ip, const cp::Endpoint& ep) {
  std::lock_guard<std::mutex> g(mu_);
  where_[ip] = ep;
}

void FakeCluster::Erase(uint32_t ip) {
  std::lock_guard<std::mutex> g(mu_);
  where_.erase(ip);
}

std::optional<cp::Endpoint> FakeCluster::Lookup(uint32_t ip) const {
  std::lock_guard<std::mutex> g(mu_);
  auto it = where_.find(ip);
  if (it == where_.end()) return std::nullopt;
  return it->second;
}

TestRouter::TestRouter(Options options) : options_(std::move(options)) {
  char tmpl[] = "/tmp/ff-router-test-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
  dir_ = tmpl;
  RouterConfig config;
  config.dir = dir_;
  config.overlay = *Ipv4Prefix::Parse(options_.overlay);
  config.node_name = options_.node;
  config.host_ip = options_.host_ip;
  config.resolve_timeout_ms = options_.resolve_timeout_ms;
  config.pod_limits = options_.limits;
  config.hello_timeout_ns = options_.hello_timeout_ns;
  config.stream_gc_period_ns = options_.stream_gc_period_ns;
  config.stream_unseen_grace_ns = options_.stream_unseen_grace_ns;
  config.spin_us = options_.spin_us;
  config.cm_spin_us = options_.cm_spin_us;
  config.direct_path = options_.direct;
  config.direct_seal = options_.direct_seal;
  config.direct_datagrams = options_.direct_datagrams;
  config.direct_port_lo = options_.direct_port_lo;
  config.direct_port_hi = options_.direct_port_hi;
  config.direct_accept_timeout_ns = options_.direct_accept_timeout_ns;
  config.resume_grace_ns = options_.resume_grace_ns;
  config.metrics_address = options_.metrics_address;
  config.cri_endpoint = options_.cri_endpoint;
  RouterDeps deps;
  auto identity = std::make_unique<FakeIdentity>();
  identity_ = identity.get();
  deps.identity = std::move(identity);
  auto streams = std::make_unique<FakeStreamProbe>();
  streams_ = streams.get();
  deps.streams = std::move(streams);
  if (options_.network != nullptr) {
    config.control_plane = "test";
    deps.control_plane = options_.cluster->PlaneFor(endpoint());
    deps.transport = options_.network->Attach(endpoint());
  }
  router_ = std::make_unique<Router>(config, std::move(deps));
  std::string error;
  if (!router_->Start(&error)) throw std::runtime_error("router start: " + error);
  std::promise<pid_t> tid;
  thread_ = std::thread([r = router_.get(), &tid] {
    tid.set_value(::gettid());
    r->Run();
  });
  router_tid_ = tid.get_future().get();
}

TestRouter::~TestRouter() {
  router_->Stop();
  thread_.join();
  router_.reset();
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

uint64_t TestRouter::CpuNs() {
  clockid_t clock;
  timespec ts{};
  if (::pthread_getcpuclockid(thread_.native_handle(), &clock) != 0 ||
      ::clock_gettime(clock, &ts) != 0)
    throw std::runtime_error("cannot read the router thread's CPU clock");
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(ts.tv_nsec);
}

uint64_t TestRouter::AwakeNs() {
  std::ifstream in("/proc/self/task/" + std::to_string(router_tid_) + "/schedstat");
  uint64_t run_ns = 0, wait_ns = 0;
  if (!(in >> run_ns >> wait_ns))
    throw std::runtime_error("cannot read the router thread's schedstat");
  return run_ns + wait_ns;
}

std::string TestRouter::Stats() {
  std::promise<std::string> line;
  router_->Post([&] { line.set_value(router_->StatsLine()); });
  return line.get_future().get();
}

uint64_t TestRouter::Stat(const std::string& name) {
  const std::string line = " " + Stats();
  const size_t at = line.find(" " + name + "=");
  if (at == std::string::npos) throw std::runtime_error("no figure " + name + " in " + line);
  return std::stoull(line.substr(at + name.size() + 2));
}

UniqueFd TestRouter::Connect(uint32_t ip, uint64_t netns) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
    throw std::runtime_error("socketpair failed");
  identity_->Expect(ip, netns);
  router_->Adopt(UniqueFd(sv[1]));
  return UniqueFd(sv[0]);
}

void TestRouter::ConnectAndHangUp(const std::string& first) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
    throw std::runtime_error("socketpair failed");
  if (!first.empty() && ::send(sv[0], first.data(), first.size(), 0) < 0)
    throw std::runtime_error("send failed");
  ::close(sv[0]);
  router_->Adopt(UniqueFd(sv[1]));
}

void TestRouter::ConnectAndHangUpDuringIdentification() {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
    throw std::runtime_error("socketpair failed");
  identity_->HangUpDuringResolve(UniqueFd(sv[0]));
  router_->Adopt(UniqueFd(sv[1]));
}

}  // namespace ff::router::test
