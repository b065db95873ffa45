#include "traffic_totals.h"

namespace ff::router {

void TrafficTotals::Claimed(TrafficPlacement placement, uint32_t peer_ip, TrafficKind kind,
                            uint64_t ops, uint64_t bytes) {
  std::string node;
  if (placement == TrafficPlacement::kSameNode) {
    node = self_;
  } else if (peer_ip != 0) {
    node = locate_(peer_ip);
  }
  if (node.empty()) node = "unknown";
  if (nodes_.count(node) == 0) {
    if (nodes_.size() >= kMaxPeerNodes) {
      node = "other";
    } else {
      nodes_.insert(node);
    }
  }
  Figures& f = totals_[Key{placement, std::move(node), kind}];
  f.ops += ops;
  f.bytes += bytes;
}

}  // namespace ff::router
