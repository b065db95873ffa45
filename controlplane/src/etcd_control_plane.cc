// etcd:URL[,URL...]. One worker thread owns the connection: it authenticates (when an etcd
// user is configured), grants (or keeps) this router's lease, claims this router's node key
// (node_claim.h: never from a live router at another endpoint), writes its published pods,
// loads the whole prefix into the cache, and then serves Publish/Withdraw and lease
// refreshes; a second thread reads the watch stream and applies its events to the cache.
// Every key it writes is under its node's own prefix (etcd_keys.h). Any failure drops the
// connection (the cache stays as it is) and the worker reconnects with backoff; a call
// whose token etcd rejects is repeated once with a new token.
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
#include "etcd_keys.h"
#include "etcd_session.h"
#include "ff_etcd_rpc.grpc.pb.h"
#include "freeflow/ipv4.h"
#include "freeflow/tunables.h"
#include "implementations.h"
#include "node_claim.h"

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

class EtcdControlPlane final : public ControlPlane {
 public:
  EtcdControlPlane(EtcdConnection connection, const Endpoint& self, const Options& options)
      : session_(std::move(connection), options.rpc_timeout),
        targets_(session_.connection().targets),
        options_(options),
        cache_(self),
        keys_(options.prefix),
        node_key_(keys_.Endpoint(self.node)),
        node_value_(NodeValue(self)),
        ttl_seconds_(std::max<int64_t>(1, (options.lease_ttl.count() + 999) / 1000)),
        refresh_interval_(ttl_seconds_ * 1000 / 3),
        jitter_(std::hash<std::string>()(self.node)) {}

  ~EtcdControlPlane() override {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
      session_.Stop();
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
    session_.Stop();
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
        spdlog::info("control plane: connected to etcd at {} (lease {:x}, {} nodes known)",
                     session_.target(), lease_, cache_.Nodes().size());
        Serve(&why);
        healthy_ = false;
        if (Stopping()) break;
      }
      Disconnect();
      const std::string& refusal = clash_.empty() ? session_.refused() : clash_;
      {
        std::lock_guard lock(mu_);
        ++attempts_;
        if (starting_ && !refusal.empty() && refusal_.empty()) {
          refusal_ = refusal;  // Start() returns it
          claim_decided_ = true;
        }
      }
      cv_.notify_all();
      if (Stopping()) break;
      if (!refusal.empty()) {
        ReportRefusal(refusal);
        backoff = options_.backoff_max;
        reported = true;
      } else if (!reported) {
        spdlog::warn("control plane: etcd at {}: {}; retrying with backoff up to {} ms",
                     session_.target(), why, options_.backoff_max.count());
        reported = true;
      } else {
        spdlog::debug("control plane: etcd at {}: {}", session_.target(), why);
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
    if (session_.is_open() && lease_ != 0) Revoke();
    Disconnect();
    healthy_ = false;
  }

  bool Connect(std::string* why) {
    clash_.clear();  // set again if this attempt finds the node name taken
    if (!session_.Open(targets_[next_target_++ % targets_.size()], why)) return false;

    // Keep the lease across reconnections when etcd still has it: nothing expires and
    // nobody sees this router go away and come back.
    if (lease_ != 0 && !KeepAlive(why)) lease_ = 0;
    if (!ClaimNode(why)) return false;  // grants a lease if it has none
    {
      std::lock_guard lock(mu_);  // everything is written below; no need to do it twice
      dirty_.clear();
    }
    for (uint32_t ip : cache_.Local())
      if (!Put(keys_.Pod(self().node, ip), "", why)) return false;

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
      watch_refusal_.clear();
    }
    session_.Close();
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
        const std::string key = keys_.Pod(self().node, ip);
        if (cache_.IsLocal(ip) ? !Put(key, "", why) : !Delete(key, why)) return;
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
    if (!session_.Unary(session_.lease(), &pb::Lease::Stub::LeaseGrant, request, &response,
                        "LeaseGrant", why))
      return false;
    if (!response.error().empty() || response.id() == 0) {
      *why = "LeaseGrant refused: " + response.error();
      return false;
    }
    lease_ = response.id();
    return true;
  }

  // One lease refresh, under a deadline like every call.
  bool KeepAlive(std::string* why) {
    int64_t ttl = 0;
    const auto timeout = std::min(options_.rpc_timeout, milliseconds(ttl_seconds_ * 1000));
    if (!session_.KeepAlive(lease_, timeout, &ttl, why)) return false;
    if (ttl <= 0) {
      *why = fmt::format("lease {:x} expired or was revoked", lease_);
      return false;
    }
    return true;
  }

  void Revoke() {
    const auto status = session_.Revoke(lease_, std::min(options_.rpc_timeout, milliseconds(1000)));
    if (status.ok())
      spdlog::info("control plane: revoked lease {:x}", lease_);
    else
      spdlog::warn("control plane: LeaseRevoke {:x}: {}; this router's entries expire in {} s",
                   lease_, Describe(status), ttl_seconds_);
    lease_ = 0;
  }

  // Writes (and deletes) only keys under this node's own prefix.
  bool Put(const std::string& key, const std::string& value, std::string* why) {
    pb::PutRequest request;
    request.set_key(key);
    request.set_value(value);
    request.set_lease(lease_);
    pb::PutResponse response;
    return session_.Unary(session_.kv(), &pb::KV::Stub::Put, request, &response, "Put " + key, why);
  }

  bool Delete(const std::string& key, std::string* why) {
    pb::DeleteRangeRequest request;
    request.set_key(key);
    pb::DeleteRangeResponse response;
    return session_.Unary(session_.kv(), &pb::KV::Stub::DeleteRange, request, &response,
                          "DeleteRange " + key, why);
  }

  // ---- the node key: one router per node name (node_claim.h) ----

  // Writes this router's node key unless a live router at another endpoint holds it. The
  // key is read and judged first (no lease is granted for a refusal); the write is one
  // transaction, "the key is still as read -> put it", so two routers claiming at once
  // cannot both win; a key that changed meanwhile is judged again.
  bool ClaimNode(std::string* why) {
    std::optional<mvccpb::KeyValue> held;  // as last read; std::nullopt: absent
    if (!ReadNodeKey(&held, why)) return false;
    for (int round = 0; round < kEtcdClaimRounds; ++round) {
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
    if (!session_.Unary(session_.kv(), &pb::KV::Stub::Range, request, &response,
                        "Range " + node_key_, why))
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
    if (!session_.Unary(session_.kv(), &pb::KV::Stub::Txn, request, &response,
                        "Txn claim " + node_key_, why))
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
        Clock::now() + std::min(kEtcdMaxHolderWait, milliseconds(last * 1000) + kEtcdExpiryMargin);
    *alive = last >= 0;
    while (*alive && Clock::now() < deadline) {
      {
        std::unique_lock lock(mu_);
        if (cv_.wait_for(lock, kEtcdHolderProbeInterval, [this] { return stop_; })) {
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
    if (!session_.Unary(session_.lease(), &pb::Lease::Stub::LeaseTimeToLive, request, &response,
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

  // A refusal (node name taken, credentials refused) found after Start() returned: an error
  // now, again when it changes, and every kEtcdRefusalLogInterval while it lasts.
  void ReportRefusal(const std::string& refusal) {
    {
      std::lock_guard lock(mu_);
      if (!refusal_.empty()) return;  // Start() hands it to its caller
    }
    const auto now = Clock::now();
    if (refusal == refusal_logged_ && now < refusal_logged_at_ + kEtcdRefusalLogInterval) return;
    spdlog::error(
        "control plane: {}. Until then this router's pods are not announced; it tries again "
        "every {} ms",
        refusal, options_.backoff_max.count());
    refusal_logged_ = refusal;
    refusal_logged_at_ = now;
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
  // while disconnected, or left by a previous run of this router). Runs before the watch
  // thread starts, which is then the only user of claims_ until Disconnect joins it.
  bool Load(int64_t* revision, std::string* why) {
    pb::RangeRequest request;
    request.set_key(options_.prefix);
    request.set_range_end(PrefixEnd(options_.prefix));
    pb::RangeResponse response;
    if (!session_.Unary(session_.kv(), &pb::KV::Stub::Range, request, &response, "Range", why))
      return false;
    *revision = response.header().revision();
    Mapping mapping;
    std::vector<std::string> stale;
    claims_.Clear();
    for (const auto& kv : response.kvs()) {
      const auto parsed = keys_.Parse(kv.key());
      if (parsed.kind == EtcdKeys::Parsed::Kind::kEndpoint) {
        if (auto endpoint = ParseNode(kv.key(), parsed.node, kv.value()))
          mapping.nodes[endpoint->node] = *endpoint;
      } else if (parsed.kind == EtcdKeys::Parsed::Kind::kPod && parsed.node == self().node) {
        if (!cache_.IsLocal(parsed.ip)) stale.push_back(kv.key());
      } else if (parsed.kind == EtcdKeys::Parsed::Kind::kPod) {
        claims_.Put(parsed.ip, parsed.node, kv.create_revision());
        WarnShared(parsed.ip);
      }
    }
    mapping.pods = claims_.Holders();
    if (cache_.Replace(std::move(mapping))) NotifyChange();
    for (const auto& key : stale) {
      spdlog::info("control plane: deleting stale {}", key);
      if (!Delete(key, why)) return false;
    }
    return true;
  }

  std::optional<Endpoint> ParseNode(const std::string& key, const std::string& name,
                                    const std::string& value) {
    auto endpoint = ParseNodeValue(name, value);
    if (!endpoint) spdlog::warn("control plane: ignoring malformed {}: {}", key, value);
    return endpoint;
  }

  // Another node announces an address that one node holds already: the first keeps it.
  void WarnShared(uint32_t ip) {
    if (claims_.Claimants(ip) < 2) return;
    spdlog::warn(
        "control plane: {} nodes announce {}; it stays with {}, which announced it first, "
        "until that node withdraws it",
        claims_.Claimants(ip), FormatIpv4(ip), claims_.Holder(ip).value_or("?"));
  }

  // Starts the watch thread and waits (bounded) until etcd confirms the watch.
  bool StartWatch(int64_t start_revision, std::string* why) {
    {
      std::lock_guard lock(mu_);
      watch_context_ = session_.WatchContext();
      if (stop_) watch_context_->TryCancel();
    }
    watcher_ =
        std::thread([this, start_revision, lease = lease_] { WatchLoop(start_revision, lease); });
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, options_.rpc_timeout,
                 [this] { return stop_ || watch_created_ || watch_failed_; });
    if (watch_created_ && !watch_failed_) return true;
    if (watch_refusal_.empty()) {
      *why = "Watch was not confirmed in time";
      return false;
    }
    return session_.Failed(grpc::Status(grpc::StatusCode::PERMISSION_DENIED, watch_refusal_),
                           "Watch", why);
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
    auto stream = session_.watch()->Watch(context);
    pb::WatchRequest request;
    auto* create = request.mutable_create_request();
    create->set_key(options_.prefix);
    create->set_range_end(PrefixEnd(options_.prefix));
    create->set_start_revision(start_revision);
    std::string reason = "the stream closed";
    if (stream->Write(request)) {
      pb::WatchResponse response;
      while (stream->Read(&response)) {
        if (response.created() && response.canceled()) {  // refused, e.g. no read permission
          std::lock_guard lock(mu_);
          watch_refusal_ = response.cancel_reason();
          break;
        }
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
    const auto parsed = keys_.Parse(key);
    if (parsed.kind == EtcdKeys::Parsed::Kind::kEndpoint) {
      if (!put) return cache_.DeleteNode(parsed.node);
      if (auto endpoint = ParseNode(key, parsed.node, event.kv().value()))
        return cache_.PutNode(*endpoint);
      return cache_.DeleteNode(parsed.node);
    }
    // This node's own pods come from Publish, never from etcd.
    if (parsed.kind != EtcdKeys::Parsed::Kind::kPod || parsed.node == self().node) return false;
    if (put) {
      const std::string holder = claims_.Put(parsed.ip, parsed.node, event.kv().create_revision());
      WarnShared(parsed.ip);
      return cache_.PutPod(parsed.ip, holder);
    }
    const auto holder = claims_.Delete(parsed.ip, parsed.node);
    return holder ? cache_.PutPod(parsed.ip, *holder) : cache_.DeletePod(parsed.ip);
  }

  EtcdSession session_;                      // the worker's, but for Stop()
  const std::vector<std::string>& targets_;  // the connection's
  const Options options_;
  Cache cache_;
  const EtcdKeys keys_;
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
  std::unique_ptr<grpc::ClientContext> watch_context_;
  bool watch_created_ = false;
  bool watch_failed_ = false;
  std::string watch_refusal_;   // why etcd refused to create the watch
  bool node_taken_ = false;     // the watch saw another writer on this router's node key
  bool starting_ = true;        // Start() waits for what follows
  bool claim_decided_ = false;  // the node key was claimed, or refused
  size_t attempts_ = 0;         // failed connection attempts
  std::string refusal_;         // a clash found while starting: Start() returns it

  // The worker's own state.
  std::minstd_rand jitter_;
  size_t next_target_ = 0;
  int64_t lease_ = 0;
  int64_t claimed_lease_ = 0;   // the lease of the last successful claim of the node key
  std::string clash_;           // why the last claim was refused; empty after a success
  std::string refusal_logged_;  // the last refusal logged, and when
  Clock::time_point refusal_logged_at_{};
  PodClaims claims_;  // other nodes' pod keys; the worker's, then the watch thread's
  std::thread watcher_;
  std::thread worker_;
};

}  // namespace

std::unique_ptr<ControlPlane> MakeEtcdControlPlane(EtcdConnection connection, const Endpoint& self,
                                                   const Options& options) {
  return std::make_unique<EtcdControlPlane>(std::move(connection), self, options);
}

}  // namespace ff::cp
