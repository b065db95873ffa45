// A build without gRPC: the runtime is never asked, and pods are shown by address.
#include <spdlog/spdlog.h>

#include "identity/pod_names.h"

namespace ff::router {

struct PodNames::Runtime {};

PodNames::PodNames(std::string endpoint, uint64_t refresh_ns)
    : endpoint_(std::move(endpoint)), refresh_ns_(refresh_ns) {
  spdlog::warn("this router was built without gRPC: it cannot ask the runtime at {} for pod names",
               endpoint_);
}
PodNames::~PodNames() = default;
std::optional<PodNames::Name> PodNames::Find(uint32_t) const { return std::nullopt; }
void PodNames::Refresh() {}
uint64_t PodNames::answers() const { return 0; }
uint64_t PodNames::failures() const { return 0; }

}  // namespace ff::router
