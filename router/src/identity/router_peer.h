// Who may take this router's place: the peer of the hand-over socket (docs/handover.md).
// The socket is abstract in the router's own network namespace, so pods, each in a
// namespace of their own, cannot reach it; of the processes that can, the router answers
// only one that runs as its own user (root), in its network namespace, with
// CAP_SYS_ADMIN in effect (what a router needs to enter pods' namespaces): a host-network
// container that is merely root is refused. The process is pinned by a pidfd
// (peer_process.h) and checked alive after its namespace and capabilities were read, so a
// recycled pid cannot stand in for it.
#pragma once

#include <string>

namespace ff::router {

// true when the peer of connected Unix socket `sock` may take the router's state; else
// false + *why (a sentence for the log).
bool TrustedRouterPeer(int sock, std::string* why);

// Whether `cap_eff` (the hexadecimal CapEff of /proc/PID/status) holds CAP_SYS_ADMIN.
bool HoldsSysAdmin(const std::string& cap_eff);

}  // namespace ff::router
