#include "node_claim.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "freeflow/ipv4.h"

namespace ff::cp {

std::string NodeValue(const Endpoint& endpoint) {
  return nlohmann::json{{"address", FormatIpv4(endpoint.address)}, {"port", endpoint.port}}.dump();
}

std::optional<Endpoint> ParseNodeValue(const std::string& name, const std::string& value) {
  if (name.empty() || name.find('/') != std::string::npos) return std::nullopt;
  const auto doc = nlohmann::json::parse(value, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object()) return std::nullopt;
  const auto address = doc.find("address");
  const auto port = doc.find("port");
  if (address == doc.end() || !address->is_string() || port == doc.end() ||
      !port->is_number_integer())
    return std::nullopt;
  const auto ip = ParseIpv4(address->get_ref<const std::string&>());
  const int64_t number = port->get<int64_t>();
  if (!ip || number < 1 || number > 65535) return std::nullopt;
  return Endpoint{name, *ip, static_cast<uint16_t>(number)};
}

NodeKeyVerdict JudgeNodeKey(const HeldNodeKey& key, const Endpoint& self,
                            const ClaimHistory& history) {
  if (key.lease == 0) return NodeKeyVerdict::kUnleased;
  if (key.lease == history.lease || key.lease == history.claimed_lease)
    return NodeKeyVerdict::kOurs;
  const auto holder = ParseNodeValue(self.node, key.value);
  if (history.claimed_lease == 0 && holder == self) return NodeKeyVerdict::kRestarted;
  return NodeKeyVerdict::kHeld;
}

std::string FormatEndpoint(const Endpoint& endpoint) {
  return fmt::format("{}:{}", FormatIpv4(endpoint.address), endpoint.port);
}

std::string NodeClashMessage(const Endpoint& self, const std::string& key,
                             const HeldNodeKey& held) {
  const auto holder = ParseNodeValue(self.node, held.value);
  const std::string where =
      holder ? FormatEndpoint(*holder) : fmt::format("an unreadable address ({})", held.value);
  const std::string same = holder == self
                               ? " (the same address: a second router on this host, or one started "
                                 "in another network namespace with this address)"
                               : "";
  return fmt::format(
      "node name \"{}\" is taken: a live router at {}{} holds it (etcd key {}, lease {:x}, "
      "kept alive), and this router serves node links on {}. Two routers must not share a "
      "node name (the default is the host name): start this router with a --node-name (or "
      "NODE_NAME) that no other router uses, or stop the router at {} first",
      self.node, where, same, key, held.lease, FormatEndpoint(self), where);
}

}  // namespace ff::cp
