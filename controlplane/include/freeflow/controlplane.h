// The control plane: tells a per-node router on which node (router endpoint) an overlay
// (pod) IPv4 address lives, and announces the addresses that live on this router's node.
//
// Two implementations, chosen by a spec string (see MakeControlPlane and
// docs/control-plane.md):
//   static:FILE          a JSON file (nodes, their pod CIDRs, explicit pod entries),
//                        reloaded when it changes;
//   etcd:URL[,URL...]    etcd v3 over gRPC; entries carry this router's lease so that a
//                        dead router's entries expire.
//
// Threading: Publish, Withdraw, Lookup and Nodes never do I/O and never wait for the
// network; they may be called from any thread (the router's epoll loop in practice).
// Background work runs on threads owned by the control plane.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ff::cp {

struct Endpoint {        // a router's router-to-router TCP endpoint
  std::string node;      // node name
  uint32_t address = 0;  // IPv4, host byte order
  uint16_t port = 0;
  bool operator==(const Endpoint&) const = default;
};

class ControlPlane {
 public:
  virtual ~ControlPlane() = default;
  // Announce/withdraw that overlay address `ip` (host order) lives on THIS router's node.
  // Never blocks: the work is queued to a background thread. Idempotent. Withdraw of an
  // unknown ip is a no-op.
  virtual void Publish(uint32_t ip) = 0;
  virtual void Withdraw(uint32_t ip) = 0;
  // Where does overlay address `ip` live? std::nullopt when unknown. Non-blocking and
  // thread-safe: served from a local cache that a background thread keeps current. The
  // router's own published addresses resolve to its own endpoint.
  virtual std::optional<Endpoint> Lookup(uint32_t ip) const = 0;
  // Every endpoint currently known, other than this router's own.
  virtual std::vector<Endpoint> Nodes() const = 0;
  // A callback run on a control plane thread whenever the mapping learnt from the file or
  // from etcd changes (not for this router's own Publish/Withdraw). Set before Start().
  virtual void OnChange(std::function<void()> cb) = 0;
  // Starts background work. false + *error (a sentence a person can act on) on bad config,
  // or when `self`'s node name is taken: a static file listing it at another endpoint (or
  // self's endpoint under another name), or a live router at another endpoint holding its
  // etcd node key. The etcd implementation blocks until its node key is claimed or refused
  // (up to the holder's remaining lease, at most ~30 s) or every URL failed once.
  virtual bool Start(std::string* error) = 0;
  // static: a valid file is loaded; etcd: connected right now.
  virtual bool Healthy() const = 0;
};

struct Options {
  // etcd: TTL of this router's lease (rounded up to whole seconds, at least 1 s). A router
  // that dies without revoking its lease disappears from the others after about this long.
  std::chrono::milliseconds lease_ttl{5000};
  // etcd: every key lives under this prefix.
  std::string prefix = "/freeflow/v1/";
  // etcd: bounds of the exponential backoff between reconnection attempts.
  std::chrono::milliseconds backoff_min{100}, backoff_max{2000};
  // etcd: deadline of each unary gRPC call (and of each lease refresh).
  std::chrono::milliseconds rpc_timeout{2000};
  // static: how long the file must be quiet after a change before it is reloaded.
  std::chrono::milliseconds reload_debounce{50};
};

// spec: "static:FILE" or "etcd:URL[,URL...]" (URL like http://127.0.0.1:2379, or host:port).
// `self` is this router's own endpoint. nullptr + *error on a malformed spec or options;
// the file or the etcd cluster is only looked at by Start().
std::unique_ptr<ControlPlane> MakeControlPlane(const std::string& spec, const Endpoint& self,
                                               const Options& options, std::string* error);

}  // namespace ff::cp
