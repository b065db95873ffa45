// Fuzz target: the static control-plane file (controlplane/src/static_file.cc), which every
// router of a cluster parses from a file an operator (or whoever can write it) controls.
// The input is the file's text; what parses is loaded into the lookup cache and queried, as
// the static control plane does after a reload.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "cache.h"
#include "static_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  ff::cp::Mapping mapping;
  std::string error;
  if (!ff::cp::ParseStaticFile(text, &mapping, &error)) {
    if (error.empty()) __builtin_trap();  // every refusal names its reason
    return 0;
  }
  ff::cp::Cache cache(ff::cp::Endpoint{"node-a", 0x0a000001, 7471});
  cache.Replace(mapping);
  // Look up every address the file names, and a neighbour of each, as pods would.
  for (const auto& [ip, node] : mapping.pods) {
    cache.Lookup(ip);
    cache.Lookup(ip + 1);
  }
  for (const ff::cp::Route& r : mapping.routes) {
    cache.Lookup(r.network);
    cache.Lookup(r.network | (r.length < 32 ? (0xffffffffu >> r.length) : 0));
  }
  cache.Nodes();
  return 0;
}
