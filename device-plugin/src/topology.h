// GetPreferredAllocation policy: fill the request from one NUMA node, and
// within it from one PCI switch, always keeping must_include.
#pragma once

#include <string>
#include <vector>

#include "backend.h"

namespace ff::dp {

// `known` is the current device list (topology source). IDs in `available`
// that are not in `known` are treated as having no topology. The result holds
// every must_include ID first, then at most size - |must_include| others.
std::vector<std::string> preferred_allocation(const std::vector<PluginDevice>& known,
                                              const std::vector<std::string>& available,
                                              const std::vector<std::string>& must_include,
                                              int size);

}  // namespace ff::dp
