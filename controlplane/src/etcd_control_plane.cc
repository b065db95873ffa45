// etcd:URL[,URL...]. One worker thread owns the connection: it grants (or keeps) this
// router's lease, claims this router's node key (node_claim.h: never from a live router at
// another endpoint), writes its published pods, loads the whole prefix into the cache, and
// then serves Publish/Withdraw and lease refreshes; a second thread reads the watch stream
// and applies its events to the cache. Any failure drops the connection (the cache stays
// as it is) and the worker reconnects with backoff.
#include <fmt/format.h>
#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "cache.h"
#include "ff_etcd_rpc.grpc.pb.h"
#include "freeflow/ipv4.h"
#include "implementations.h"
#include "node_claim.h"

namespace ff::cp {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
namespace pb = etcdserverpb;

// A node key that changes under a claim this many times in a row fails the attempt.
constexpr int kClaimRounds = 8;
// Another router's lease on this router's node key: read its time to live this often, and
// wait at most its time to live plus kExpiryMargin (etcd reports whole seconds, truncated,
// and revokes expired leases in a periodic sweep), never longer than kMaxHolderWait.
constexpr milliseconds kProbeInterval{100};
constexpr milliseconds kExpiryMargin{1500};
constexpr milliseconds kMaxHolderWait{30000};
// While another router holds this router's node name, the error is repeated this often.
constexpr std::chrono::seconds kClashLogInterval{60};

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
        node_key_(nodes_prefix_ + self.node),
        node_value_(NodeValue(self)),
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
    // Wait until the node key is claimed or refused, or every URL failed once (with etcd
    // down the router starts and keeps trying). Each attempt is bounded by its deadlines.
    std::unique_lock lock(mu_);
    cv_.wait(lock, [this] { return claim_decided_ || attempts_ >= targets_.size(); });
    starting_ = false;
    if (refusal_.empty()) return true;
    *error = refusal_;
    stop_ = true;
    lock.unlock();
    cv_.notify_all();
    worker_.join();
    return false;
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

  // One unary call under a deadline (`rpc`: a stub method such as &pb::KV::Stub::Put).
  // false + *why ("<what>: <status>") when it fails.
  template <typename Stub, typename Request, typename Response>
  bool Unary(Stub* stub, grpc::Status (Stub::*rpc)(grpc::ClientContext*, const Request&, Response*),
             const Request& request, Response* response, std::string_view what, std::string* why) {
    Call call(this, options_.rpc_timeout);
    const auto status = (stub->*rpc)(&call.context, request, response);
    if (status.ok()) return true;
    *why = fmt::format("{}: {}", what, Describe(status));
    return false;
  }

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
      {
        std::lock_guard lock(mu_);
        ++attempts_;
      }
      cv_.notify_all();
      if (Stopping()) break;
      if (!clash_.empty()) {
        ReportClash();
        backoff = options_.backoff_max;
        reported = true;
      } else if (!reported) {
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
    clash_.clear();  // set again if this attempt finds the node name taken
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
    if (!ClaimNode(why)) return false;  // grants a lease if it has none
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
                       [this] { return stop_ || watch_failed_ || node_taken_ || !dirty_.empty(); });
        if (stop_) return;
        if (node_taken_) {  // give up this lease: its pod keys would lead to the other router
          node_taken_ = false;
          lock.unlock();
          Revoke();
          *why = "another router wrote this node's key";
          return;
        }
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
    pb::LeaseGrantRequest request;
    request.set_ttl(ttl_seconds_);
    pb::LeaseGrantResponse response;
    if (!Unary(lease_stub_.get(), &pb::Lease::Stub::LeaseGrant, request, &response, "LeaseGrant",
               why))
      return false;
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
    pb::PutRequest request;
    request.set_key(key);
    request.set_value(value);
    request.set_lease(lease_);
    pb::PutResponse response;
    return Unary(kv_.get(), &pb::KV::Stub::Put, request, &response, "Put " + key, why);
  }

  // Deletes `key` only while it still names this node: a pod that moved to another node
  // keeps that node's entry.
  bool DeleteOwn(const std::string& key, std::string* why) {
    pb::TxnRequest request;
    auto* compare = request.add_compare();
    compare->set_result(pb::Compare::EQUAL);
    compare->set_target(pb::Compare::VALUE);
    compare->set_key(key);
    compare->set_value(self().node);
    request.add_success()->mutable_request_delete_range()->set_key(key);
    pb::TxnResponse response;
    return Unary(kv_.get(), &pb::KV::Stub::Txn, request, &response, "Txn delete " + key, why);
  }

  // ---- the node key: one router per node name (node_claim.h) ----

  // Writes this router's node key unless a live router at another endpoint holds it. The
  // key is read and judged first (no lease is granted for a refusal); the write is one
  // transaction, "the key is still as read -> put it", so two routers claiming at once
  // cannot both win; a key that changed meanwhile is judged again.
  bool ClaimNode(std::string* why) {
    std::optional<mvccpb::KeyValue> held;  // as last read; std::nullopt: absent
    if (!ReadNodeKey(&held, why)) return false;
    for (int round = 0; round < kClaimRounds; ++round) {
      if (held) {
        const HeldNodeKey key{held->value(), held->lease()};
        const NodeKeyVerdict verdict = JudgeNodeKey(key, self(), {lease_, claimed_lease_});
        if (verdict == NodeKeyVerdict::kHeld) {
          bool alive = false;
          if (!ProbeLease(key.lease, &alive, why)) return false;
          if (alive) return Clash(key, why);
          held.reset();  // the lease is gone and its keys with it
        } else if (verdict == NodeKeyVerdict::kUnleased) {
          spdlog::warn("control plane: {} = {} has no lease, so no router keeps it; taking it",
                       node_key_, key.value);
        } else if (verdict == NodeKeyVerdict::kRestarted) {
          spdlog::info(
              "control plane: {} holds this router's own address under lease {:x}: a "
              "previous run on this host whose lease has not expired yet; taking it over",
              node_key_, key.lease);
        }
      }
      if (lease_ == 0 && !Grant(why)) return false;
      bool written = false;
      if (!PutIfUnchanged(&held, &written, why)) return false;
      if (written) {
        claimed_lease_ = lease_;
        clash_.clear();
        Decided();
        return true;
      }
    }
    *why = fmt::format("{} kept changing while this router claimed it", node_key_);
    return false;
  }

  bool ReadNodeKey(std::optional<mvccpb::KeyValue>* held, std::string* why) {
    pb::RangeRequest request;
    request.set_key(node_key_);
    pb::RangeResponse response;
    if (!Unary(kv_.get(), &pb::KV::Stub::Range, request, &response, "Range " + node_key_, why))
      return false;
    held->reset();
    if (response.kvs_size() == 1) *held = response.kvs(0);
    return true;
  }

  // One transaction: if the node key is still *held (absent, or at its mod revision), put
  // this router's value under lease_ (*written); else read the key into *held.
  bool PutIfUnchanged(std::optional<mvccpb::KeyValue>* held, bool* written, std::string* why) {
    pb::TxnRequest request;
    auto* compare = request.add_compare();
    compare->set_key(node_key_);
    compare->set_result(pb::Compare::EQUAL);
    if (*held) {
      compare->set_target(pb::Compare::MOD);
      compare->set_mod_revision((*held)->mod_revision());
    } else {
      compare->set_target(pb::Compare::VERSION);
      compare->set_version(0);
    }
    auto* put = request.add_success()->mutable_request_put();
    put->set_key(node_key_);
    put->set_value(node_value_);
    put->set_lease(lease_);
    request.add_failure()->mutable_request_range()->set_key(node_key_);
    pb::TxnResponse response;
    if (!Unary(kv_.get(), &pb::KV::Stub::Txn, request, &response, "Txn claim " + node_key_, why))
      return false;
    *written = response.succeeded();
    held->reset();
    if (!*written && response.responses_size() == 1 &&
        response.responses(0).response_range().kvs_size() == 1)
      *held = response.responses(0).response_range().kvs(0);
    return true;
  }

  // Is `lease` kept alive? Its time to live is read until it goes up (refreshed: alive),
  // the lease is gone (dead), or the time it had left ran out with the lease still there
  // (it was refreshed: alive). A router that crashed moments ago is not mistaken for a
  // live one: its lease is waited out.
  bool ProbeLease(int64_t lease, bool* alive, std::string* why) {
    int64_t last = 0;
    if (!TimeToLive(lease, &last, why)) return false;
    const auto deadline =
        Clock::now() + std::min(kMaxHolderWait, milliseconds(last * 1000) + kExpiryMargin);
    *alive = last >= 0;
    while (*alive && Clock::now() < deadline) {
      {
        std::unique_lock lock(mu_);
        if (cv_.wait_for(lock, kProbeInterval, [this] { return stop_; })) {
          *why = "stopping";
          return false;
        }
      }
      int64_t ttl = 0;
      if (!TimeToLive(lease, &ttl, why)) return false;
      *alive = ttl >= 0;
      if (ttl > last) break;
      last = ttl;
    }
    return true;
  }

  // Whole seconds `lease` has left, -1 when it does not exist.
  bool TimeToLive(int64_t lease, int64_t* ttl, std::string* why) {
    pb::LeaseTimeToLiveRequest request;
    request.set_id(lease);
    pb::LeaseTimeToLiveResponse response;
    if (!Unary(lease_stub_.get(), &pb::Lease::Stub::LeaseTimeToLive, request, &response,
               fmt::format("LeaseTimeToLive {:x}", lease), why))
      return false;
    *ttl = response.ttl();
    return true;
  }

  bool Clash(const HeldNodeKey& held, std::string* why) {
    clash_ = NodeClashMessage(self(), node_key_, held);
    *why = clash_;
    if (lease_ != 0) Revoke();
    {
      std::lock_guard lock(mu_);
      if (starting_) refusal_ = clash_;
    }
    Decided();
    return false;
  }

  void Decided() {
    {
      std::lock_guard lock(mu_);
      claim_decided_ = true;
    }
    cv_.notify_all();
  }

  // A clash found after Start() returned: an error now, again when it changes, and every
  // kClashLogInterval while it lasts.
  void ReportClash() {
    {
      std::lock_guard lock(mu_);
      if (!refusal_.empty()) return;  // Start() hands it to its caller
    }
    const auto now = Clock::now();
    if (clash_ == clash_logged_ && now < clash_logged_at_ + kClashLogInterval) return;
    spdlog::error(
        "control plane: {}. Until then this router's pods are not announced; it tries again "
        "every {} ms",
        clash_, options_.backoff_max.count());
    clash_logged_ = clash_;
    clash_logged_at_ = now;
  }

  // On the watch thread: this router's node key was written under a lease not its own.
  // Logged at once; the worker drops the connection and its next claim decides (refused
  // while the other router lives: no writing back and forth).
  void NodeKeyTaken(const mvccpb::KeyValue& kv, int64_t lease) {
    spdlog::error(
        "control plane: another writer took this router's node key: {} is now {} (lease {:x}), "
        "not this router's {} (lease {:x}). Two routers may share the node name \"{}\"",
        node_key_, kv.value(), kv.lease(), FormatEndpoint(self()), lease, self().node);
    {
      std::lock_guard lock(mu_);
      node_taken_ = true;
    }
    cv_.notify_all();
  }

  // Reads the whole prefix into the cache; deletes this node's stale pod keys (withdrawn
  // while disconnected, or left by a previous run of this router).
  bool Load(int64_t* revision, std::string* why) {
    pb::RangeRequest request;
    request.set_key(options_.prefix);
    request.set_range_end(PrefixEnd(options_.prefix));
    pb::RangeResponse response;
    if (!Unary(kv_.get(), &pb::KV::Stub::Range, request, &response, "Range", why)) return false;
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
    auto endpoint = ParseNodeValue(name, value);
    if (!endpoint)
      spdlog::warn("control plane: ignoring malformed {}{}: {}", nodes_prefix_, name, value);
    return endpoint;
  }

  // Starts the watch thread and waits (bounded) until etcd confirms the watch.
  bool StartWatch(int64_t start_revision, std::string* why) {
    {
      std::lock_guard lock(mu_);
      watch_context_ = std::make_unique<grpc::ClientContext>();
      if (stop_) watch_context_->TryCancel();
    }
    watcher_ =
        std::thread([this, start_revision, lease = lease_] { WatchLoop(start_revision, lease); });
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, options_.rpc_timeout,
                 [this] { return stop_ || watch_created_ || watch_failed_; });
    if (watch_created_ && !watch_failed_) return true;
    *why = "Watch was not confirmed in time";
    return false;
  }

  // ---- the watch thread ----

  // `lease`: this router's lease on this connection; its node key under any other lease
  // was written by someone else.
  void WatchLoop(int64_t start_revision, int64_t lease) {
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
        for (const auto& event : response.events()) changed |= Apply(event, lease);
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

  bool Apply(const mvccpb::Event& event, int64_t lease) {
    const std::string& key = event.kv().key();
    const bool put = event.type() == mvccpb::Event::PUT;
    if (put && key == node_key_ && event.kv().lease() != lease) NodeKeyTaken(event.kv(), lease);
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
  const std::string node_key_, node_value_;  // this router's node key and its value
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
  bool node_taken_ = false;     // the watch saw another writer on this router's node key
  bool starting_ = true;        // Start() waits for what follows
  bool claim_decided_ = false;  // the node key was claimed, or refused
  size_t attempts_ = 0;         // failed connection attempts
  std::string refusal_;         // a clash found while starting: Start() returns it

  // The worker's own state.
  std::minstd_rand jitter_;
  size_t next_target_ = 0;
  std::string target_;
  int64_t lease_ = 0;
  int64_t claimed_lease_ = 0;  // the lease of the last successful claim of the node key
  std::string clash_;          // why the last claim was refused; empty after a success
  std::string clash_logged_;   // the last clash logged, and when
  Clock::time_point clash_logged_at_{};
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
