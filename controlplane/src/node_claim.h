// Who may write a router's node key in etcd (<prefix>nodes/<node>): the rules that keep two
// routers from sharing a node name, apart from the etcd calls so that unit tests reach
// them. docs/control-plane.md, "One router per node name", says why each rule is there.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "freeflow/controlplane.h"

namespace ff::cp {

// A node key's value: {"address":"172.31.0.2","port":7471}.
std::string NodeValue(const Endpoint& endpoint);
// The endpoint of node `name` in `value`; std::nullopt when the name is empty or holds a
// '/', or the value is not an object with an IPv4 "address" and a "port" in 1-65535.
std::optional<Endpoint> ParseNodeValue(const std::string& name, const std::string& value);

// The node key as etcd holds it.
struct HeldNodeKey {
  std::string value;
  int64_t lease = 0;  // 0: written without a lease
};

// What a router knows of its own claims on its node key.
struct ClaimHistory {
  int64_t lease = 0;          // the lease it holds now (0: none)
  int64_t claimed_lease = 0;  // the lease of its last successful claim (0: never claimed)
};

enum class NodeKeyVerdict {
  kOurs,       // under one of this router's leases: write it again
  kUnleased,   // written without a lease, so no router keeps it alive: take it
  kRestarted,  // this router's own endpoint under another lease, and this router never
               // claimed the key: a previous run on this host (crashed, its lease not yet
               // expired). Take it over. Once a router has claimed the key, the same
               // endpoint under a foreign lease is kHeld: the two would take turns.
  kHeld,       // another router holds it; refuse unless its lease turns out to be dead
};

NodeKeyVerdict JudgeNodeKey(const HeldNodeKey& key, const Endpoint& self,
                            const ClaimHistory& history);

// The refusal: names the node, the key, both endpoints (the holder's as read, or its raw
// value when unreadable) and the lease, and says what to do.
std::string NodeClashMessage(const Endpoint& self, const std::string& key, const HeldNodeKey& held);

// "172.31.0.2:7471".
std::string FormatEndpoint(const Endpoint& endpoint);

}  // namespace ff::cp
