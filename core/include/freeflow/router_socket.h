// Where a node's router listens: the one rule every party that finds it uses (the router
// itself, both preloaded libraries and the device plugin), so that FREEFLOW_DIR and
// FFR_NAME mean the same thing to all of them.
#pragma once

#include <string>

namespace ff {

// The host folder and router name a party uses when it is told none.
inline constexpr const char* kDefaultFreeflowDir = "/freeflow";
inline constexpr const char* kDefaultRouterName = "ffrouter";

// DIR/NAME.sock: the router's pod socket in host folder `dir`.
std::string RouterSocketPath(const std::string& dir, const std::string& name);

// The router's admin socket (ffctl, docs/metrics.md): an abstract Unix socket of the
// router's network namespace, "freeflow-admin:DIR/NAME" (without the abstract name's
// leading NUL), so that pods, each in a namespace of its own, can neither see nor reach it.
std::string AdminSocketName(const std::string& dir, const std::string& name);

// The router socket a pod's process reaches: FREEFLOW_DIR (default /freeflow) and FFR_NAME
// (default ffrouter) from its environment; an empty variable counts as unset.
std::string RouterSocketPathFromEnv();

}  // namespace ff
