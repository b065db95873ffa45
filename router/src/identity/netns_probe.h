// What a network namespace holds, read through rtnetlink by a thread that has entered it:
// every IPv4 address, the name and flags of its interface, and whether that interface's
// link partner (a veth peer, a macvlan/ipvlan parent) lives in the router's namespace.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "freeflow/fd.h"
#include "identity/identity.h"

namespace ff::router {

// A netlink socket of `protocol` in the calling thread's namespace whose every receive
// gives up after kNetlinkTimeoutMs. Empty + *error (naming `what`) on failure.
UniqueFd OpenNetlink(int protocol, const char* what, std::string* error);

// What runs inside a namespace: given the namespace's device and inode (as stat() names
// /proc/thread-self/ns/net), it sets *error on failure.
using NamespaceWork = std::function<void(dev_t dev, ino_t ino, std::string* error)>;
// Runs `work` on a short-lived thread that entered the network namespace behind `nsfd` (a
// pidfd or an /proc/<pid>/ns/net descriptor): setns() moves only the calling thread, so the
// router's own threads never change namespace. false + *error when the thread cannot start
// (an error, not a crash), cannot enter or name the namespace, or `work` failed.
bool RunInNamespace(int nsfd, const NamespaceWork& work, std::string* error);

// An open descriptor (O_RDONLY | O_CLOEXEC) of the network namespace of the process at the
// other end of connected Unix socket `sock`: the namespace itself, pinned, so that it stays
// the one checked here whatever the process does later (a pidfd would follow the process
// into another namespace). It must be the namespace of inode `expect_ino`, the one the
// process was identified in (PodIdentity::netns). false + *error.
bool OpenPeerNamespace(int sock, uint64_t expect_ino, UniqueFd* out, std::string* error);

// Reads the calling thread's network namespace. `router_netns` is an open descriptor of the
// router's own namespace (/proc/self/ns/net). A namespace with more than kMaxNetnsEntries
// interfaces or addresses is refused. false + *error.
bool ReadNamespaceAddresses(int router_netns, std::vector<InterfaceAddress>* out,
                            std::string* error);

}  // namespace ff::router
