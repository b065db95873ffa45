// The control plane: tells a per-node router on which node (router endpoint) an overlay
// (pod) IPv4 address lives, and announces the addresses that live on this router's node.
//
// Two implementations, chosen by a spec string (see MakeControlPlane and
// docs/control-plane.md):
//   static:FILE          a JSON file (nodes, their pod CIDRs, explicit pod entries),
//                        reloaded when it changes;
//   etcd:URL[,URL...]    etcd v3 over gRPC (plaintext or TLS, with a client certificate
//                        and/or etcd's user/password authentication); entries carry this
//                        router's lease so that a dead router's entries expire.
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
  // etcd node key, or when etcd refused this router's credentials (a wrong password, a
  // certificate or CA etcd does not accept, no permission on its node's keys). The etcd
  // implementation blocks until its node key is claimed or refused (up to the holder's
  // remaining lease, at most ~30 s) or every URL failed once.
  virtual bool Start(std::string* error) = 0;
  // static: a valid file is loaded; etcd: connected right now.
  virtual bool Healthy() const = 0;
};

// etcd: how the control plane checks that it talks to etcd, and proves to etcd who it is
// (docs/control-plane.md, "Running etcd securely"). The router fills it from --etcd-cacert,
// --etcd-cert, --etcd-key, --etcd-user and --etcd-password, or ETCDCTL_CACERT, ETCDCTL_CERT,
// ETCDCTL_KEY, ETCDCTL_USER and ETCDCTL_PASSWORD, as etcdctl names them. Files are read by
// MakeControlPlane, which refuses a file it cannot read, a certificate without its key (or
// a key without its certificate), TLS files with an http:// endpoint, and a user without a
// password.
struct EtcdSecurity {
  std::string cacert;    // PEM CA bundle that signed etcd's certificate; empty: system roots
  std::string cert;      // PEM client certificate (chain), presented to etcd
  std::string key;       // its PEM private key
  std::string user;      // etcd user to authenticate as; empty: none (with etcd's
                         // --client-cert-auth, the certificate's CN is the user)
  std::string password;  // that user's password
};

struct Options {
  // etcd: TTL of this router's lease (rounded up to whole seconds, at least 1 s). A router
  // that dies without revoking its lease disappears from the others after about this long.
  std::chrono::milliseconds lease_ttl{5000};
  // etcd: every key lives under this prefix; a router writes only under
  // <prefix>nodes/<its node>/ (docs/control-plane.md, "Keys in etcd").
  std::string prefix = "/freeflow/v2/";
  // etcd: bounds of the exponential backoff between reconnection attempts.
  std::chrono::milliseconds backoff_min{100}, backoff_max{2000};
  // etcd: deadline of each unary gRPC call (and of each lease refresh).
  std::chrono::milliseconds rpc_timeout{2000};
  // static: how long the file must be quiet after a change before it is reloaded.
  std::chrono::milliseconds reload_debounce{50};
  // etcd: TLS and authentication.
  EtcdSecurity etcd;
};

// spec: "static:FILE" or "etcd:URL[,URL...]" (URL like http://127.0.0.1:2379,
// https://etcd.example:2379, or host:port: TLS when any TLS file is given). `self` is this
// router's own endpoint. nullptr + *error on a malformed spec or options, or an etcd TLS
// file that cannot be read; the static file or the etcd cluster is only looked at by
// Start().
std::unique_ptr<ControlPlane> MakeControlPlane(const std::string& spec, const Endpoint& self,
                                               const Options& options, std::string* error);

}  // namespace ff::cp
