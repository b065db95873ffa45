// One connection to one etcd endpoint, as the etcd implementation's worker thread uses it:
// the channel (plaintext, or TLS with the CA and client certificate of an EtcdConnection),
// the token of etcd's user/password authentication sent with every call, calls under a
// deadline that a stop cancels, and what etcd's errors mean: a rejected token is renewed and
// the call repeated once; a refusal of this router's credentials is put in words a person
// can act on.
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "etcd_config.h"
#include "ff_etcd_rpc.grpc.pb.h"

namespace ff::cp {

// The gRPC metadata key etcd reads a token from (etcd's Authenticate returns it).
inline constexpr char kTokenMetadata[] = "token";

// etcd rejected the token a call carried: expired, invalidated (the user's password
// changed, etcd restarted with simple tokens) or older than the auth store. Authenticating
// again and repeating the call is the cure.
bool IsTokenError(const grpc::Status& status);

// etcd (or the TLS handshake with it) refused this client's credentials: a wrong user or
// password, no credentials while etcd requires them, no permission on a key, or a
// certificate one side does not accept. Retrying with the same configuration cannot help.
// Returns the sentence to tell the person who configured the router ("" when `status` is
// not such a refusal). `what`: the call that failed; `first`: no call on this channel has
// been answered yet (a connection that breaks later is an outage, not a refusal).
std::string DescribeRefusal(const grpc::Status& status, std::string_view what,
                            const EtcdConnection& connection, bool first);

// "<message> (<code>)".
std::string Describe(const grpc::Status& status);

class EtcdSession {
 public:
  EtcdSession(EtcdConnection connection, std::chrono::milliseconds rpc_timeout);

  const EtcdConnection& connection() const { return connection_; }
  const std::string& target() const { return target_; }
  bool is_open() const { return channel_ != nullptr; }

  // A new channel to `target`, then Authenticate when a user is configured. false + *why.
  bool Open(const std::string& target, std::string* why);
  void Close();
  // Any thread: cancels the call in flight and every later one (but Revoke), for good.
  void Stop();

  etcdserverpb::KV::Stub* kv() const { return kv_.get(); }
  etcdserverpb::Lease::Stub* lease() const { return lease_.get(); }
  etcdserverpb::Watch::Stub* watch() const { return watch_.get(); }

  // One unary call under the RPC deadline (`rpc`: a stub method such as
  // &etcdserverpb::KV::Stub::Put), repeated once with a new token when etcd rejects the
  // token. false + *why ("<what>: <status>", or the refusal) when it fails.
  template <typename Stub, typename Request, typename Response>
  bool Unary(Stub* stub, grpc::Status (Stub::*rpc)(grpc::ClientContext*, const Request&, Response*),
             const Request& request, Response* response, std::string_view what, std::string* why) {
    for (bool retried = false;; retried = true) {
      Call call(this, rpc_timeout_);
      const auto status = (stub->*rpc)(&call.context, request, response);
      if (status.ok()) return answered_ = true;
      if (retried || !TokenRejected(status, what)) return Failed(status, what, why);
      if (!Authenticate(why)) return false;
    }
  }

  // One refresh of `lease` on a short-lived stream under `timeout`: *ttl is what etcd says
  // is left (0 or less: the lease is gone). false + *why on failure.
  bool KeepAlive(int64_t lease, std::chrono::milliseconds timeout, int64_t* ttl, std::string* why);
  // Revokes `lease`, even after Stop().
  grpc::Status Revoke(int64_t lease, std::chrono::milliseconds timeout);
  // A context for the watch stream, carrying the token.
  std::unique_ptr<grpc::ClientContext> WatchContext() const;

  // Always false: *why for the failed call `what`; remembers whether etcd refused this
  // router's credentials (refused()).
  bool Failed(const grpc::Status& status, std::string_view what, std::string* why);
  // The refusal the last failure was, "" when it was none (an outage, a timeout).
  const std::string& refused() const { return refused_; }

 private:
  // A client context with a deadline and the token, registered so that Stop() cancels it
  // (unless `survives_stop`).
  class Call {
   public:
    Call(EtcdSession* session, std::chrono::milliseconds timeout, bool survives_stop = false);
    ~Call();
    grpc::ClientContext context;

   private:
    EtcdSession* session_;
  };

  // Gets a token for the configured user, sent with every call from now on. Nothing to do
  // without a user (etcd then takes the client certificate's CN, or has auth off).
  bool Authenticate(std::string* why, bool survives_stop = false);
  // Whether `status` rejects the token that `what` carried (and says so in the log): then
  // authenticate again and repeat the call.
  bool TokenRejected(const grpc::Status& status, std::string_view what);

  const EtcdConnection connection_;
  const std::chrono::milliseconds rpc_timeout_;
  std::string target_;
  std::string token_;  // from Authenticate; empty without an etcd user
  std::string refused_;
  bool answered_ = false;  // a call on this channel succeeded
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<etcdserverpb::KV::Stub> kv_;
  std::unique_ptr<etcdserverpb::Lease::Stub> lease_;
  std::unique_ptr<etcdserverpb::Watch::Stub> watch_;
  std::unique_ptr<etcdserverpb::Auth::Stub> auth_;

  std::mutex mu_;  // guards what follows
  bool stopped_ = false;
  grpc::ClientContext* active_ = nullptr;
};

}  // namespace ff::cp
