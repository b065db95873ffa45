// etcd:URL[,URL...]. One worker thread owns the connection: it grants (or keeps) this
// router's lease, writes this router's node key and published pods, loads the whole prefix
// into the cache, and then serves Publish/Withdraw and lease refreshes; a second thread
// reads the watch stream and applies its events to the cache. Any failure drops the
// connection (the cache stays as it is) and the worker reconnects with backoff.
#include <fmt/format.h>
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>

#include "cache.h"
#include "ff_etcd_rpc.grpc.pb.h"
#include "freeflow/ipv4.h"
#include "implementations.h"

namespace ff::cp {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
namespace pb = etcdserverpb;

// The end of the key range holding every key that starts with `prefix`.
std::string PrefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) < 0xff) {
      end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

std::string Describe(const grpc::Status& status) {
  return fmt::format("{} ({})", status.error_message(), static_cast<int>(status.error_code()));
}

class EtcdControlPlane final : public ControlPlane {
 public:
  EtcdControlPlane(std::vector<std::string> targets, const Endpoint& self, const Options& options)
      : targets_(std::move(targets)),
        options_(options),
        cache_(self),
        nodes_prefix_(options.prefix + "nodes/"),
        pods_prefix_(options.prefix + "pods/"),
        ttl_seconds_(std::max<int64_t>(1, (options.lease_ttl.count() + 999) / 1000)),
        refresh_interval_(ttl_seconds_ * 1000 / 3),
        jitter_(std::hash<std::string>()(self.node)) {}

  ~EtcdControlPlane() override {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
      if (active_call_) active_call_->TryCancel();
      if (watch_context_) watch_context_->TryCancel();
    }
    cv_.notify_all();
    if (worker_.joinable()) worker_.join();
  }

  void Publish(uint32_t ip) override {
    if (cache_.AddLocal(ip)) MarkDirty(ip);
  }
  void Withdraw(uint32_t ip) override {
    if (cache_.RemoveLocal(ip)) MarkDirty(ip);
  }
  std::optional<Endpoint> Lookup(uint32_t ip) const override { return cache_.Lookup(ip); }
  std::vector<Endpoint> Nodes() const override { return cache_.Nodes(); }
  void OnChange(std::function<void()> cb) override { on_change_ = std::move(cb); }
  bool Healthy() const override { return healthy_; }

  bool Start(std::string* error) override {
    if (worker_.joinable()) {
      *error = "the control plane is already started";
      return false;
    }
    worker_ = std::thread([this] { Run(); });
    return true;
  }

 private:
  const Endpoint& self() const { return cache_.self(); }

  void MarkDirty(uint32_t ip) {
    {
      std::lock_guard lock(mu_);
      dirty_.insert(ip);
    }
    cv_.notify_all();
  }

  void NotifyChange() {
    std::lock_guard lock(change_mu_);
    if (on_change_) on_change_();
  }

  bool Stopping() {
    std::lock_guard lock(mu_);
    return stop_;
  }

  // A client context with a deadline. Unless `survives_stop`, it is registered so that
  // the destructor cancels it (and it starts cancelled once stopping).
  class Call {
   public:
    Call(EtcdControlPlane* cp, milliseconds timeout, bool survives_stop = false)
        : cp_(survives_stop ? nullptr : cp) {
      context.set_deadline(std::chrono::system_clock::now() + timeout);
      if (!cp_) return;
      std::lock_guard lock(cp_->mu_);
      if (cp_->stop_) context.TryCancel();
      cp_->active_call_ = &context;
    }
    ~Call() {
      if (!cp_) return;
      std::lock_guard lock(cp_->mu_);
      cp_->active_call_ = nullptr;
    }
    grpc::ClientContext context;

   private:
    EtcdControlPlane* cp_;
  };

  // ---- the worker thread ----

  void Run() {
    milliseconds backoff = options_.backoff_min;
    bool reported = false;  // a failure was logged since the last success
    while (!Stopping()) {
      std::string why;
      if (Connect(&why)) {
        healthy_ = true;
        backoff = options_.backoff_min;
        reported = false;
        spdlog::info("control plane: connected to etcd at {} (lease {:x}, {} nodes known)", target_,
                     lease_, cache_.Nodes().size());
        Serve(&why);
        healthy_ = false;
        if (Stopping()) break;
      }
      Disconnect();
      if (Stopping()) break;
      if (!reported) {
        spdlog::warn("control plane: etcd at {}: {}; retrying with backoff up to {} ms", target_,
                     why, options_.backoff_max.count());
        reported = true;
      } else {
        spdlog::debug("control plane: etcd at {}: {}", target_, why);
      }
      // +-20% jitter, so that routers do not all come back at the same instant.
      const auto jittered = milliseconds(static_cast<int64_t>(
          backoff.count() * std::uniform_real_distribution<double>(0.8, 1.2)(jitter_)));
      {
        std::unique_lock lock(mu_);
        cv_.wait_for(lock, jittered, [this] { return stop_; });
      }
      backoff = std::min(backoff * 2, options_.backoff_max);
    }
    if (channel_ && lease_ != 0) Revoke();
    Disconnect();
    healthy_ = false;
  }

  bool Connect(std::string* why) {
    target_ = targets_[next_target_++ % targets_.size()];
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);  // a Range of a large cluster may exceed 4 MiB
    channel_ = grpc::CreateCustomChannel(target_, grpc::InsecureChannelCredentials(), args);
    kv_ = pb::KV::NewStub(channel_);
    lease_stub_ = pb::Lease::NewStub(channel_);
    watch_stub_ = pb::Watch::NewStub(channel_);

    // Keep the lease across reconnections when etcd still has it: nothing expires and
    // nobody sees this router go away and come back.
    if (lease_ != 0 && !KeepAlive(why)) lease_ = 0;
    if (lease_ == 0 && !Grant(why)) return false;

    const std::string node_value =
        nlohmann::json{{"address", FormatIpv4(self().address)}, {"port", self().port}}.dump();
    if (!Put(nodes_prefix_ + self().node, node_value, why)) return false;
    {
      std::lock_guard lock(mu_);  // everything is written below; no need to do it twice
      dirty_.clear();
    }
    for (uint32_t ip : cache_.Local())
      if (!Put(pods_prefix_ + FormatIpv4(ip), self().node, why)) return false;

    int64_t revision = 0;
    if (!Load(&revision, why)) return false;
    return StartWatch(revision + 1, why);
  }

  void Disconnect() {
    {
      std::lock_guard lock(mu_);
      if (watch_context_) watch_context_->TryCancel();
    }
    if (watcher_.joinable()) watcher_.join();
    {
      std::lock_guard lock(mu_);
      watch_context_.reset();
      watch_failed_ = false;
      watch_created_ = false;
    }
    kv_.reset();
    lease_stub_.reset();
    watch_stub_.reset();
    channel_.reset();
  }

  // Connected: writes Publish/Withdraw changes, refreshes the lease. Returns on failure
  // (with *why) or on stop.
  void Serve(std::string* why) {
    auto next_refresh = Clock::now() + refresh_interval_;
    while (true) {
      std::set<uint32_t> work;
      {
        std::unique_lock lock(mu_);
        cv_.wait_until(lock, next_refresh,
                       [this] { return stop_ || watch_failed_ || !dirty_.empty(); });
        if (stop_) return;
        if (watch_failed_) {
          *why = "the watch stream ended";
          return;
        }
        work.swap(dirty_);
      }
      // A failure leaves the rest undone: reconnecting rewrites every published pod and
      // deletes this node's stale pod keys.
      for (uint32_t ip : work) {
        const std::string key = pods_prefix_ + FormatIpv4(ip);
        if (cache_.IsLocal(ip) ? !Put(key, self().node, why) : !DeleteOwn(key, why)) return;
      }
      if (Clock::now() >= next_refresh) {
        if (!KeepAlive(why)) {
          lease_ = 0;
          return;
        }
        next_refresh = Clock::now() + refresh_interval_;
      }
    }
  }

  bool Grant(std::string* why) {
    Call call(this, options_.rpc_timeout);
    pb::LeaseGrantRequest request;
    request.set_ttl(ttl_seconds_);
    pb::LeaseGrantResponse response;
    const auto status = lease_stub_->LeaseGrant(&call.context, request, &response);
    if (!status.ok()) {
      *why = "LeaseGrant: " + Describe(status);
      return false;
    }
    if (!response.error().empty() || response.id() == 0) {
      *why = "LeaseGrant refused: " + response.error();
      return false;
    }
    lease_ = response.id();
    return true;
  }

  // One lease refresh on a short-lived stream, so that it has a deadline like every call.
  bool KeepAlive(std::string* why) {
    Call call(this, std::min(options_.rpc_timeout, milliseconds(ttl_seconds_ * 1000)));
    auto stream = lease_stub_->LeaseKeepAlive(&call.context);
    pb::LeaseKeepAliveRequest request;
    request.set_id(lease_);
    pb::LeaseKeepAliveResponse response;
    const bool ok = stream->Write(request) && stream->Read(&response);
    stream->WritesDone();
    const auto status = stream->Finish();
    if (!ok) {
      *why = "LeaseKeepAlive: " + (status.ok() ? std::string("no answer") : Describe(status));
      return false;
    }
    if (response.ttl() <= 0) {
      *why = fmt::format("lease {:x} expired or was revoked", lease_);
      return false;
    }
    return true;
  }

  void Revoke() {
    Call call(this, std::min(options_.rpc_timeout, milliseconds(1000)), /*survives_stop=*/true);
    pb::LeaseRevokeRequest request;
    request.set_id(lease_);
    pb::LeaseRevokeResponse response;
    const auto status = lease_stub_->LeaseRevoke(&call.context, request, &response);
    if (status.ok())
      spdlog::info("control plane: revoked lease {:x}", lease_);
    else
      spdlog::warn("control plane: LeaseRevoke {:x}: {}; this router's entries expire in {} s",
                   lease_, Describe(status), ttl_seconds_);
    lease_ = 0;
  }

  bool Put(const std::string& key, const std::string& value, std::string* why) {
    Call call(this, options_.rpc_timeout);
    pb::PutRequest request;
    request.set_key(key);
    request.set_value(value);
    request.set_lease(lease_);
    pb::PutResponse response;
    const auto status = kv_->Put(&call.context, request, &response);
    if (!status.ok()) {
      *why = fmt::format("Put {}: {}", key, Describe(status));
      return false;
    }
    return true;
  }

  // Deletes `key` only while it still names this node: a pod that moved to another node
  // keeps that node's entry.
  bool DeleteOwn(const std::string& key, std::string* why) {
    Call call(this, options_.rpc_timeout);
    pb::TxnRequest request;
    auto* compare = request.add_compare();
    compare->set_result(pb::Compare::EQUAL);
    compare->set_target(pb::Compare::VALUE);
    compare->set_key(key);
    compare->set_value(self().node);
    request.add_success()->mutable_request_delete_range()->set_key(key);
    pb::TxnResponse response;
    const auto status = kv_->Txn(&call.context, request, &response);
    if (!status.ok()) {
      *why = fmt::format("Txn delete {}: {}", key, Describe(status));
      return false;
    }
    return true;
  }

  // Reads the whole prefix into the cache; deletes this node's stale pod keys (withdrawn
  // while disconnected, or left by a previous run of this router).
  bool Load(int64_t* revision, std::string* why) {
    pb::RangeResponse response;
    {
      Call call(this, options_.rpc_timeout);
      pb::RangeRequest request;
      request.set_key(options_.prefix);
      request.set_range_end(PrefixEnd(options_.prefix));
      const auto status = kv_->Range(&call.context, request, &response);
      if (!status.ok()) {
        *why = "Range: " + Describe(status);
        return false;
      }
    }
    *revision = response.header().revision();
    Mapping mapping;
    std::vector<std::string> stale;
    for (const auto& kv : response.kvs()) {
      if (Ingest(kv.key(), kv.value(), &mapping)) continue;
      stale.push_back(kv.key());
    }
    if (cache_.Replace(std::move(mapping))) NotifyChange();
    for (const auto& key : stale) {
      spdlog::info("control plane: deleting stale {}", key);
      if (!DeleteOwn(key, why)) return false;
    }
    return true;
  }

  // Adds one key to `mapping`. false only for a pod key naming this node that this router
  // has not published (a stale key to delete).
  bool Ingest(const std::string& key, const std::string& value, Mapping* mapping) {
    if (key.starts_with(nodes_prefix_)) {
      if (auto endpoint = ParseNode(key.substr(nodes_prefix_.size()), value))
        mapping->nodes[endpoint->node] = *endpoint;
    } else if (key.starts_with(pods_prefix_)) {
      const auto ip = ParseIpv4(std::string_view(key).substr(pods_prefix_.size()));
      if (!ip) return true;
      if (value == self().node) return cache_.IsLocal(*ip);
      mapping->pods[*ip] = value;
    }
    return true;
  }

  std::optional<Endpoint> ParseNode(const std::string& name, const std::string& value) {
    if (name.empty() || name.find('/') != std::string::npos) return std::nullopt;
    const auto doc = nlohmann::json::parse(value, nullptr, /*allow_exceptions=*/false);
    std::optional<uint32_t> address;
    if (doc.is_object() && doc.contains("address") && doc["address"].is_string())
      address = ParseIpv4(doc["address"].get<std::string>());
    const bool port_ok = doc.is_object() && doc.contains("port") &&
                         doc["port"].is_number_integer() && doc["port"].get<int64_t>() > 0 &&
                         doc["port"].get<int64_t>() <= 65535;
    if (!address || !port_ok) {
      spdlog::warn("control plane: ignoring malformed {}{}: {}", nodes_prefix_, name, value);
      return std::nullopt;
    }
    return Endpoint{name, *address, static_cast<uint16_t>(doc["port"].get<int64_t>())};
  }

  // Starts the watch thread and waits (bounded) until etcd confirms the watch.
  bool StartWatch(int64_t start_revision, std::string* why) {
    {
      std::lock_guard lock(mu_);
      watch_context_ = std::make_unique<grpc::ClientContext>();
      if (stop_) watch_context_->TryCancel();
    }
    watcher_ = std::thread([this, start_revision] { WatchLoop(start_revision); });
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, options_.rpc_timeout,
                 [this] { return stop_ || watch_created_ || watch_failed_; });
    if (watch_created_ && !watch_failed_) return true;
    *why = "Watch was not confirmed in time";
    return false;
  }

  // ---- the watch thread ----

  void WatchLoop(int64_t start_revision) {
    grpc::ClientContext* context;
    {
      std::lock_guard lock(mu_);
      context = watch_context_.get();
    }
    auto stream = watch_stub_->Watch(context);
    pb::WatchRequest request;
    auto* create = request.mutable_create_request();
    create->set_key(options_.prefix);
    create->set_range_end(PrefixEnd(options_.prefix));
    create->set_start_revision(start_revision);
    std::string reason = "the stream closed";
    if (stream->Write(request)) {
      pb::WatchResponse response;
      while (stream->Read(&response)) {
        if (response.created()) {
          {
            std::lock_guard lock(mu_);
            watch_created_ = true;
          }
          cv_.notify_all();
        }
        if (response.canceled() || response.compact_revision() != 0) {
          reason = fmt::format("etcd cancelled the watch ({}; compacted at {})",
                               response.cancel_reason(), response.compact_revision());
          break;
        }
        bool changed = false;
        for (const auto& event : response.events()) changed |= Apply(event);
        if (changed) NotifyChange();
      }
    }
    context->TryCancel();
    const auto status = stream->Finish();
    if (!status.ok() && status.error_code() != grpc::StatusCode::CANCELLED)
      reason = Describe(status);
    {
      std::lock_guard lock(mu_);
      watch_failed_ = true;
      if (!stop_) spdlog::debug("control plane: watch ended: {}", reason);
    }
    cv_.notify_all();
  }

  bool Apply(const mvccpb::Event& event) {
    const std::string& key = event.kv().key();
    const bool put = event.type() == mvccpb::Event::PUT;
    if (key.starts_with(nodes_prefix_)) {
      const std::string name = key.substr(nodes_prefix_.size());
      if (!put) return cache_.DeleteNode(name);
      if (auto endpoint = ParseNode(name, event.kv().value())) return cache_.PutNode(*endpoint);
      return cache_.DeleteNode(name);
    }
    if (key.starts_with(pods_prefix_)) {
      const auto ip = ParseIpv4(std::string_view(key).substr(pods_prefix_.size()));
      if (!ip) return false;
      // This node's own pods come from Publish, never from etcd.
      if (!put || event.kv().value() == self().node) return cache_.DeletePod(*ip);
      return cache_.PutPod(*ip, event.kv().value());
    }
    return false;
  }

  const std::vector<std::string> targets_;
  const Options options_;
  Cache cache_;
  const std::string nodes_prefix_, pods_prefix_;
  const int64_t ttl_seconds_;
  const milliseconds refresh_interval_;

  std::mutex change_mu_;  // one OnChange callback at a time
  std::function<void()> on_change_;
  std::atomic<bool> healthy_{false};

  std::mutex mu_;  // guards what follows, up to the worker's own state
  std::condition_variable cv_;
  bool stop_ = false;
  std::set<uint32_t> dirty_;  // published or withdrawn since last written to etcd
  grpc::ClientContext* active_call_ = nullptr;
  std::unique_ptr<grpc::ClientContext> watch_context_;
  bool watch_created_ = false;
  bool watch_failed_ = false;

  // The worker's own state.
  std::minstd_rand jitter_;
  size_t next_target_ = 0;
  std::string target_;
  int64_t lease_ = 0;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::KV::Stub> kv_;
  std::unique_ptr<pb::Lease::Stub> lease_stub_;
  std::unique_ptr<pb::Watch::Stub> watch_stub_;
  std::thread watcher_;
  std::thread worker_;
};

}  // namespace

std::unique_ptr<ControlPlane> MakeEtcdControlPlane(std::vector<std::string> targets,
                                                   const Endpoint& self, const Options& options) {
  return std::make_unique<EtcdControlPlane>(std::move(targets), self, options);
}

}  // namespace ff::cp
