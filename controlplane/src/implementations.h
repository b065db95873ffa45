// Constructors of the two implementations, for MakeControlPlane.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "etcd_config.h"
#include "freeflow/controlplane.h"

namespace ff::cp {

std::unique_ptr<ControlPlane> MakeStaticControlPlane(std::string path, const Endpoint& self,
                                                     const Options& options);
// `connection`: checked by MakeEtcdConnection; its targets are tried in turn.
std::unique_ptr<ControlPlane> MakeEtcdControlPlane(EtcdConnection connection, const Endpoint& self,
                                                   const Options& options);

}  // namespace ff::cp
