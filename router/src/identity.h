// Who is on the other end of a router connection: the router never believes what a
// client says about itself. It asks the kernel for the peer's process (SO_PEERPIDFD /
// SO_PEERCRED), enters that process's network namespace and reads its overlay address.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "freeflow/ipv4.h"

namespace ff::router {

struct PodIdentity {
  pid_t pid = 0;
  uint32_t ip = 0;  // host byte order, inside the overlay prefix
};

// Seam for tests: the real resolver needs root and namespaces.
class IdentityResolver {
 public:
  virtual ~IdentityResolver() = default;
  // Resolves the peer of connected Unix socket `sock`. On failure returns false and sets
  // *error to a sentence a person can act on.
  virtual bool Resolve(int sock, PodIdentity* out, std::string* error) = 0;
};

std::unique_ptr<IdentityResolver> MakeNetnsIdentityResolver(Ipv4Prefix overlay);

}  // namespace ff::router
