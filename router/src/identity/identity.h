// Who is on the other end of a router connection: the router never believes what a
// client says about itself. It asks the kernel for the peer's process (SO_PEERPIDFD, or a
// pid checked against the socket it holds), enters that process's network namespace and
// takes the namespace's one overlay address. See docs/security.md, "Pod identity".
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "freeflow/ipv4.h"

namespace ff::router {

struct PodIdentity {
  pid_t pid = 0;
  uint32_t ip = 0;     // host byte order, inside the overlay prefix
  uint64_t netns = 0;  // inode of the client's network namespace (0: unknown, as in tests)
};

// Seam for tests: the real resolver needs root and namespaces.
class IdentityResolver {
 public:
  virtual ~IdentityResolver() = default;
  // Resolves the peer of connected Unix socket `sock`. On failure returns false and sets
  // *error to a sentence a person can act on. Never throws.
  virtual bool Resolve(int sock, PodIdentity* out, std::string* error) = 0;
};

// One IPv4 address of a network namespace, with what the router needs to know about the
// interface that holds it.
struct InterfaceAddress {
  std::string ifname;
  unsigned flags = 0;   // IFF_* of the interface
  uint32_t ip = 0;      // host byte order
  bool linked = false;  // the interface's link partner (veth peer, macvlan/ipvlan parent)
                        // lives in the router's network namespace
};

// The one overlay address of a client's network namespace, from all its IPv4 addresses
// (pure, for tests). Refuses: no address or more than one inside `overlay`; an address on
// a loopback interface or on one that is down; and, unless the namespace is the router's own
// (`router_namespace`), an interface not linked to the router's namespace. false + *error.
bool ChooseOverlayAddress(const std::vector<InterfaceAddress>& addresses, const Ipv4Prefix& overlay,
                          bool router_namespace, uint32_t* ip, std::string* error);

struct IdentityOptions {
  Ipv4Prefix overlay;
  // Serve processes in the router's own network namespace (host networking). Off: refused.
  bool allow_host_network = false;
  // Ask the kernel for the peer's pidfd (SO_PEERPIDFD, Linux >= 6.5). Off, or on older
  // kernels: the peer's pid is opened as a pidfd and accepted only if that process holds the
  // other end of the connection (tests turn this off to exercise that path).
  bool use_peer_pidfd = true;
};

std::unique_ptr<IdentityResolver> MakeNetnsIdentityResolver(IdentityOptions options);

}  // namespace ff::router
