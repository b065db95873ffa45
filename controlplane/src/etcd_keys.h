// The etcd control plane's keys, laid out so that every key a router writes lies under one
// prefix of its own node, <prefix>nodes/<node>/, and etcd's RBAC can confine a router to it
// (docs/control-plane.md, "Keys in etcd"; scripts/ff-etcd-auth.sh):
//   <prefix>nodes/<node>/endpoint     {"address":"172.31.0.2","port":7471} (node_claim.h)
//   <prefix>nodes/<node>/pods/<ip>    empty: overlay address <ip> lives on <node>
// Every router reads the whole prefix. Node names hold no '/' (MakeControlPlane checks it),
// so one node's prefix never holds another node's keys.
//
// Since each node writes its own pod keys, two nodes may announce one address (a pod that
// moved, a misconfigured or compromised node). PodClaims decides: the oldest announcement
// (lowest create revision) holds the address until it is withdrawn or its lease ends, so a
// node cannot take over an address another node already serves.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace ff::cp {

class EtcdKeys {
 public:
  explicit EtcdKeys(std::string prefix) : prefix_(std::move(prefix)) {}

  const std::string& prefix() const { return prefix_; }
  // <prefix>nodes/<node>/: every key of `node`.
  std::string NodeDir(const std::string& node) const;
  std::string Endpoint(const std::string& node) const;
  std::string Pod(const std::string& node, uint32_t ip) const;

  struct Parsed {
    enum class Kind { kOther, kEndpoint, kPod } kind = Kind::kOther;
    std::string node;
    uint32_t ip = 0;  // kPod
  };
  // What `key` is; kOther for anything that is not one of the two kinds above (other
  // keys under the prefix are ignored, not an error).
  Parsed Parse(std::string_view key) const;

 private:
  std::string prefix_;
};

// Which node each overlay address belongs to, from the pod keys of every node but this
// router's own. Not thread-safe: the etcd implementation uses it from one thread at a time.
class PodClaims {
 public:
  // Records `node`'s announcement of `ip`, created at `create_revision`. Returns the node
  // that holds `ip` now.
  std::string Put(uint32_t ip, const std::string& node, int64_t create_revision);
  // Forgets `node`'s announcement of `ip`; returns the node that holds `ip` now, if any.
  std::optional<std::string> Delete(uint32_t ip, const std::string& node);
  // Every address and the node that holds it.
  std::map<uint32_t, std::string> Holders() const;
  // The node that holds `ip`, if any, and how many nodes announce it.
  std::optional<std::string> Holder(uint32_t ip) const;
  size_t Claimants(uint32_t ip) const;
  void Clear() { claims_.clear(); }

 private:
  // ip -> node -> create revision of that node's key.
  std::map<uint32_t, std::map<std::string, int64_t>> claims_;
};

}  // namespace ff::cp
