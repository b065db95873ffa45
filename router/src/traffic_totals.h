// The node's traffic, as its pods' libraries count it (pods/traffic_claims.h): work requests
// and their bytes by placement, the peer's node and kind, from the router's start. The labels
// are the router's own: a pod says to which address it sent, the control plane says which
// node holds that address; what goes to a pod of this node is labelled with this node.
// Threading: the loop's thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <tuple>

#include "pods/traffic_claims.h"

namespace ff::router {

class TrafficTotals final : public TrafficSink {
 public:
  // `locate(ip)`: the node that holds overlay address `ip`, or "" when none is known.
  TrafficTotals(std::string self, std::function<std::string(uint32_t)> locate)
      : self_(std::move(self)), locate_(std::move(locate)) {}

  void Claimed(TrafficPlacement placement, uint32_t peer_ip, TrafficKind kind, uint64_t ops,
               uint64_t bytes) override;

  struct Key {
    TrafficPlacement placement;
    std::string peer_node;  // "unknown" when no node holds the address (or several peers)
    TrafficKind kind;
    bool operator<(const Key& o) const {
      return std::tie(placement, peer_node, kind) < std::tie(o.placement, o.peer_node, o.kind);
    }
  };
  struct Figures {
    uint64_t ops = 0;
    uint64_t bytes = 0;
  };
  const std::map<Key, Figures>& totals() const { return totals_; }

  // At most this many peer nodes get series of their own; work requests to others are
  // counted under "other" (the control plane is the cluster's, but a bound is a bound).
  static constexpr size_t kMaxPeerNodes = 1024;

 private:
  std::string self_;
  std::function<std::string(uint32_t)> locate_;
  std::map<Key, Figures> totals_;
  std::set<std::string> nodes_;  // peer nodes with series
};

}  // namespace ff::router
