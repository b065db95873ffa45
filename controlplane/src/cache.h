// The mapping both implementations serve Lookup/Nodes from, and the set of addresses this
// router has published. One reader-writer lock; readers never wait for I/O.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "freeflow/controlplane.h"

namespace ff::cp {

struct Route {           // a pod CIDR of a node
  uint32_t network = 0;  // host order, host bits clear
  uint32_t length = 0;   // 0..32
  std::string node;
  bool operator==(const Route&) const = default;
};

// What a file says, or what etcd holds under the prefix.
struct Mapping {
  std::map<std::string, Endpoint> nodes;  // by node name; Endpoint::node == key
  std::map<uint32_t, std::string> pods;   // explicit pod address -> node name
  std::vector<Route> routes;              // pod CIDRs, any order
  bool operator==(const Mapping&) const = default;
};

class Cache {
 public:
  explicit Cache(Endpoint self);

  // Lookup order: an address this router published -> self; an explicit pod entry; the
  // longest matching pod CIDR. An entry naming this router's node resolves to `self`; an
  // entry naming an unknown node resolves to nothing.
  std::optional<Endpoint> Lookup(uint32_t ip) const;
  // Every known node but this router's own.
  std::vector<Endpoint> Nodes() const;

  // Each returns whether the mapping changed.
  bool Replace(Mapping mapping);
  bool PutNode(const Endpoint& endpoint);
  bool DeleteNode(const std::string& node);
  bool PutPod(uint32_t ip, const std::string& node);
  bool DeletePod(uint32_t ip);
  Mapping Snapshot() const;

  // This router's own addresses. Return whether the set changed.
  bool AddLocal(uint32_t ip);
  bool RemoveLocal(uint32_t ip);
  bool IsLocal(uint32_t ip) const;
  std::set<uint32_t> Local() const;

  const Endpoint& self() const { return self_; }

 private:
  void IndexRoutes();  // rebuilds route_index_ from mapping_.routes; lock held
  std::optional<Endpoint> Resolve(const std::string& node) const;  // lock held

  const Endpoint self_;
  mutable std::shared_mutex mu_;
  Mapping mapping_;
  std::set<uint32_t> local_;
  // Pod CIDRs indexed by (length << 32 | network), and the lengths present, longest first.
  std::unordered_map<uint64_t, std::string> route_index_;
  std::vector<uint32_t> route_lengths_;
};

}  // namespace ff::cp
