#include "freeflow/controlplane.h"

#include <fmt/format.h>

#include "etcd_config.h"
#include "implementations.h"

namespace ff::cp {

std::unique_ptr<ControlPlane> MakeControlPlane(const std::string& spec, const Endpoint& self,
                                               const Options& options, std::string* error) {
  if (self.node.empty() || self.node.find('/') != std::string::npos) {
    *error = fmt::format("the router's node name \"{}\" must be non-empty and contain no '/'",
                         self.node);
    return nullptr;
  }
  if (options.backoff_min.count() <= 0 || options.backoff_max < options.backoff_min) {
    *error = fmt::format("control plane backoff bounds {} ms..{} ms: need 0 < min <= max",
                         options.backoff_min.count(), options.backoff_max.count());
    return nullptr;
  }
  if (options.lease_ttl.count() <= 0 || options.rpc_timeout.count() <= 0) {
    *error = "control plane lease TTL and RPC timeout must be positive";
    return nullptr;
  }
  if (options.prefix.empty()) {
    *error = "control plane key prefix must not be empty";
    return nullptr;
  }
  if (spec.starts_with("static:")) {
    std::string path = spec.substr(7);
    if (path.empty()) {
      *error = "control plane spec \"static:\" names no file; use static:/path/to/nodes.json";
      return nullptr;
    }
    return MakeStaticControlPlane(std::move(path), self, options);
  }
  if (spec.starts_with("etcd:")) {
    EtcdConnection connection;
    if (!MakeEtcdConnection(spec.substr(5), options.etcd, &connection, error)) return nullptr;
    auto cp = MakeEtcdControlPlane(std::move(connection), self, options);
    if (!cp) *error = "this build has no etcd support";
    return cp;
  }
  *error = fmt::format(
      "control plane spec \"{}\" must be static:FILE or etcd:URL[,URL...] "
      "(for example etcd:http://127.0.0.1:2379)",
      spec);
  return nullptr;
}

}  // namespace ff::cp
