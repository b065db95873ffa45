// Constructors of the two implementations, for MakeControlPlane.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "freeflow/controlplane.h"

namespace ff::cp {

std::unique_ptr<ControlPlane> MakeStaticControlPlane(std::string path, const Endpoint& self,
                                                     const Options& options);
// `targets` are gRPC targets ("host:port"), tried in turn.
std::unique_ptr<ControlPlane> MakeEtcdControlPlane(std::vector<std::string> targets,
                                                   const Endpoint& self, const Options& options);

}  // namespace ff::cp
