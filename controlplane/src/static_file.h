// The static control plane's JSON file:
//   {"nodes": [{"name": "node-a", "address": "172.31.0.2", "port": 7471,
//               "podCIDRs": ["10.244.1.0/24"]}, ...],
//    "pods": {"10.244.3.7": "node-b"}}
#pragma once

#include <string>
#include <string_view>

#include "cache.h"

namespace ff::cp {

// Parses the file's text. false + *error naming the offending field, e.g.
// `nodes[1].podCIDRs[0]: "10.244.2/24" is not an IPv4 prefix`.
bool ParseStaticFile(std::string_view text, Mapping* mapping, std::string* error);

// What a parsed file says about the router itself (`self`: its node name and the endpoint
// it serves node links on). `problem` is empty when the file lists it as it is; `fatal`
// when the router must not start on this file: the file gives its node name another
// endpoint (the other routers would send this node's traffic there), or gives its endpoint
// another node name (it was started under the wrong name, e.g. the host name by default).
// A node name the file does not list at all is not fatal, only reported in `problem`: the
// node may be new and the file (a ConfigMap, say) not updated yet; every router reloads it
// when it changes, and the node's pods become reachable then without a restart.
struct SelfCheck {
  bool fatal = false;
  std::string problem;
};
SelfCheck CheckSelf(const Mapping& mapping, const Endpoint& self);

}  // namespace ff::cp
