// What a network namespace holds, read through rtnetlink by a thread that has entered it:
// every IPv4 address, the name and flags of its interface, and whether that interface's
// link partner (a veth peer, a macvlan/ipvlan parent) lives in the router's namespace.
#pragma once

#include <string>
#include <vector>

#include "freeflow/fd.h"
#include "identity.h"

namespace ff::router {

// A netlink socket of `protocol` in the calling thread's namespace whose every receive
// gives up after kNetlinkTimeoutMs. Empty + *error (naming `what`) on failure.
UniqueFd OpenNetlink(int protocol, const char* what, std::string* error);

// Reads the calling thread's network namespace. `router_netns` is an open descriptor of the
// router's own namespace (/proc/self/ns/net). A namespace with more than kMaxNetnsEntries
// interfaces or addresses is refused. false + *error.
bool ReadNamespaceAddresses(int router_netns, std::vector<InterfaceAddress>* out,
                            std::string* error);

}  // namespace ff::router
