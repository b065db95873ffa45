#include "freeflow/controlplane.h"

#include <fmt/format.h>

#include "implementations.h"

namespace ff::cp {
namespace {

std::string Trim(std::string s) {
  const auto b = s.find_first_not_of(" \t");
  const auto e = s.find_last_not_of(" \t");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

// "http://host:port", "host:port" -> "host:port". Empty + *error otherwise.
std::string TargetFromUrl(const std::string& url, std::string* error) {
  std::string rest = url;
  if (rest.starts_with("https://")) {
    *error = fmt::format("etcd endpoint \"{}\": TLS is not supported; use http://", url);
    return {};
  }
  if (rest.starts_with("http://")) rest = rest.substr(7);
  while (!rest.empty() && rest.back() == '/') rest.pop_back();
  const auto colon = rest.rfind(':');
  const bool has_port = colon != std::string::npos && colon + 1 < rest.size() &&
                        rest.find_first_not_of("0123456789", colon + 1) == std::string::npos;
  if (rest.empty() || rest.find('/') != std::string::npos || !has_port || colon == 0) {
    *error =
        fmt::format("etcd endpoint \"{}\" is not of the form http://HOST:PORT or HOST:PORT", url);
    return {};
  }
  const int port = std::stoi(rest.substr(colon + 1));
  if (port < 1 || port > 65535 || rest.size() - colon - 1 > 5) {
    *error = fmt::format("etcd endpoint \"{}\": the port is not in 1-65535", url);
    return {};
  }
  return rest;
}

}  // namespace

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
    std::vector<std::string> targets;
    const std::string list = spec.substr(5);
    size_t begin = 0;
    while (begin <= list.size()) {
      size_t end = list.find(',', begin);
      if (end == std::string::npos) end = list.size();
      const std::string url = Trim(list.substr(begin, end - begin));
      if (!url.empty()) {
        std::string target = TargetFromUrl(url, error);
        if (target.empty()) return nullptr;
        targets.push_back(std::move(target));
      }
      begin = end + 1;
    }
    if (targets.empty()) {
      *error = "control plane spec \"etcd:\" names no endpoint; use etcd:http://HOST:2379";
      return nullptr;
    }
    auto cp = MakeEtcdControlPlane(std::move(targets), self, options);
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
