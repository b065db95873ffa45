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

}  // namespace ff::cp
