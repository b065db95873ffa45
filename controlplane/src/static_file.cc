#include "static_file.h"

#include <fmt/format.h>

#include <map>
#include <nlohmann/json.hpp>

#include "freeflow/ipv4.h"
#include "node_claim.h"

namespace ff::cp {
namespace {

using nlohmann::json;

// A JSON value as it would be written in the file, for error messages.
std::string Show(const json& value) {
  std::string s = value.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

bool Fail(std::string* error, std::string message) {
  *error = std::move(message);
  return false;
}

bool ParsePrefix(const json& value, const std::string& field, Route* route, std::string* error) {
  if (!value.is_string())
    return Fail(error, fmt::format("{}: expected a string like \"10.244.1.0/24\", got {}", field,
                                   Show(value)));
  const std::string& text = value.get_ref<const std::string&>();
  const auto prefix = text.find('/') == std::string::npos ? std::nullopt : Ipv4Prefix::Parse(text);
  if (!prefix)
    return Fail(error, fmt::format("{}: \"{}\" is not an IPv4 prefix (like \"10.244.1.0/24\")",
                                   field, text));
  if (ParseIpv4(text.substr(0, text.find('/'))) != prefix->network)
    return Fail(error, fmt::format("{}: \"{}\" has host bits set (did you mean \"{}\"?)", field,
                                   text, prefix->ToString()));
  route->network = prefix->network;
  route->length = prefix->length;
  return true;
}

bool ParseNode(const json& value, const std::string& field, Endpoint* node,
               std::vector<Route>* routes, std::string* error) {
  if (!value.is_object())
    return Fail(error, fmt::format("{}: expected an object with name, address and port, got {}",
                                   field, Show(value)));
  const auto name = value.find("name");
  if (name == value.end()) return Fail(error, fmt::format("{}.name: missing", field));
  if (!name->is_string() || name->get_ref<const std::string&>().empty())
    return Fail(error,
                fmt::format("{}.name: expected a non-empty string, got {}", field, Show(*name)));
  node->node = name->get<std::string>();

  const auto address = value.find("address");
  if (address == value.end()) return Fail(error, fmt::format("{}.address: missing", field));
  const auto ip =
      address->is_string() ? ParseIpv4(address->get_ref<const std::string&>()) : std::nullopt;
  if (!ip)
    return Fail(error, fmt::format("{}.address: {} is not an IPv4 address", field, Show(*address)));
  node->address = *ip;

  const auto port = value.find("port");
  if (port == value.end()) return Fail(error, fmt::format("{}.port: missing", field));
  if (!port->is_number_integer() || port->get<int64_t>() < 1 || port->get<int64_t>() > 65535)
    return Fail(error,
                fmt::format("{}.port: {} is not a port number (1-65535)", field, Show(*port)));
  node->port = static_cast<uint16_t>(port->get<int64_t>());

  const auto cidrs = value.find("podCIDRs");
  if (cidrs == value.end()) return true;
  if (!cidrs->is_array())
    return Fail(error, fmt::format("{}.podCIDRs: expected an array of prefixes, got {}", field,
                                   Show(*cidrs)));
  for (size_t i = 0; i < cidrs->size(); ++i) {
    Route route;
    if (!ParsePrefix((*cidrs)[i], fmt::format("{}.podCIDRs[{}]", field, i), &route, error))
      return false;
    route.node = node->node;
    routes->push_back(std::move(route));
  }
  return true;
}

}  // namespace

bool ParseStaticFile(std::string_view text, Mapping* mapping, std::string* error) {
  json doc;
  try {
    doc = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {  // parse_error, or out_of_range for a huge number
    return Fail(error, fmt::format("not valid JSON: {}", e.what()));
  }
  if (!doc.is_object()) return Fail(error, "top level: expected a JSON object with \"nodes\"");

  Mapping out;
  const auto nodes = doc.find("nodes");
  if (nodes == doc.end()) return Fail(error, "nodes: missing");
  if (!nodes->is_array())
    return Fail(error, fmt::format("nodes: expected an array, got {}", Show(*nodes)));
  std::map<std::string, size_t> node_index;  // name -> position, for duplicate reports
  // Each prefix -> the field that defined it, for duplicate reports.
  std::map<std::pair<uint32_t, uint32_t>, std::string> prefix_field;
  for (size_t i = 0; i < nodes->size(); ++i) {
    const std::string field = fmt::format("nodes[{}]", i);
    Endpoint node;
    std::vector<Route> routes;
    if (!ParseNode((*nodes)[i], field, &node, &routes, error)) return false;
    if (auto [it, fresh] = node_index.emplace(node.node, i); !fresh)
      return Fail(error, fmt::format("{}.name: \"{}\" is already used by nodes[{}]", field,
                                     node.node, it->second));
    for (size_t j = 0; j < routes.size(); ++j) {
      const std::string cidr_field = fmt::format("{}.podCIDRs[{}]", field, j);
      auto [it, fresh] =
          prefix_field.emplace(std::pair(routes[j].length, routes[j].network), cidr_field);
      if (!fresh)
        return Fail(error, fmt::format("{}: {} is already assigned by {}", cidr_field,
                                       Ipv4Prefix{routes[j].network, routes[j].length}.ToString(),
                                       it->second));
      out.routes.push_back(std::move(routes[j]));
    }
    out.nodes.emplace(node.node, std::move(node));
  }

  const auto pods = doc.find("pods");
  if (pods != doc.end()) {
    if (!pods->is_object())
      return Fail(error, fmt::format("pods: expected an object mapping pod addresses to node "
                                     "names, got {}",
                                     Show(*pods)));
    for (const auto& [key, value] : pods->items()) {
      const std::string field = fmt::format("pods[\"{}\"]", key);
      const auto ip = ParseIpv4(key);
      if (!ip) return Fail(error, fmt::format("{}: \"{}\" is not an IPv4 address", field, key));
      if (!value.is_string())
        return Fail(error,
                    fmt::format("{}: expected a node name (a string), got {}", field, Show(value)));
      const std::string& node = value.get_ref<const std::string&>();
      if (!out.nodes.count(node))
        return Fail(error, fmt::format("{}: node \"{}\" is not listed in nodes", field, node));
      out.pods.emplace(*ip, node);
    }
  }
  *mapping = std::move(out);
  return true;
}

SelfCheck CheckSelf(const Mapping& mapping, const Endpoint& self) {
  const std::string here = FormatEndpoint(self);
  std::string named_here;  // the node the file puts at this router's endpoint, if another
  for (const auto& [name, endpoint] : mapping.nodes)
    if (name != self.node && endpoint.address == self.address && endpoint.port == self.port)
      named_here = name;
  const std::string hint = named_here.empty()
                               ? ""
                               : fmt::format(" (the file lists {} as node \"{}\": --node-name {}?)",
                                             here, named_here, named_here);
  const auto listed = mapping.nodes.find(self.node);
  if (listed != mapping.nodes.end()) {
    const Endpoint& there = listed->second;
    if (there.address == self.address && there.port == self.port) return {};
    return {true, fmt::format("it lists node \"{0}\" at {1}, but this router serves node links "
                              "on {2}: the other routers would send {0}'s traffic to {1}. "
                              "If this host is not {0}, start this router with its own "
                              "--node-name (or NODE_NAME; the default is the host name){3}; if "
                              "it is, correct the file or this router's --host-ip/--port",
                              self.node, FormatEndpoint(there), here, hint)};
  }
  if (!named_here.empty())
    return {true, fmt::format("this router's node name \"{}\" is not in it, but its address {} "
                              "is, as node \"{}\": start this router with --node-name {} (or "
                              "NODE_NAME; the default is the host name)",
                              self.node, here, named_here, named_here)};
  return {false,
          fmt::format("node \"{}\" is not in it, so the routers that use this file cannot reach "
                      "this node's pods until it lists them (the file is reloaded when it "
                      "changes): add {{\"name\": \"{}\", \"address\": \"{}\", \"port\": {}}} to "
                      "its nodes, or start this router with the --node-name it has there",
                      self.node, self.node, FormatIpv4(self.address), self.port)};
}

}  // namespace ff::cp
