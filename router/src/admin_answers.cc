// What `ffctl` gets from the admin socket (docs/metrics.md, "ffctl"): one JSON document a
// command, built on the loop's thread from what the router holds.
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <vector>

#include "freeflow/ipv4.h"
#include "freeflow/qp_kind.h"
#include "router.h"

namespace ff::router {
namespace {

using nlohmann::json;

const char* TypeName(const QpKind* kind) { return kind != nullptr ? QpTypeName(kind->type) : "?"; }

// A quota's counts as an object keyed by the quota's name ("qps", "mapped", ...: the byte
// quotas in bytes).
json ByQuota(const Quotas::Counts& counts) {
  json o = json::object();
  for (const QuotaSpec& q : kQuotaSpecs) o[ResourceName(q)] = counts[static_cast<size_t>(q.quota)];
  return o;
}

constexpr const char* kCommands = "pods, qps [ADDRESS], links, quotas, events";

}  // namespace

std::string Router::AdminAnswer(const std::string& request) const {
  std::istringstream words(request);
  std::string command, arg, extra;
  words >> command >> arg >> extra;
  json out;
  if (command == "pods" && arg.empty()) {
    out["pods"] = AdminPods();
  } else if (command == "qps" && extra.empty()) {
    const std::optional<uint32_t> only = arg.empty() ? 0 : ParseIpv4(arg);
    if (!only) return json{{"error", "'" + arg + "' is not a pod address"}}.dump();
    out["qps"] = AdminQps(*only);
  } else if (command == "links" && arg.empty()) {
    json links = json::array();
    if (transport_ != nullptr) {
      for (const LinkView& l : transport_->Links())
        links.push_back({{"id", l.id},
                         {"peer", l.peer},
                         {"dialled", l.dialled},
                         {"state", l.state},
                         {"queued_bytes", l.queued_bytes},
                         {"idle_ms", l.idle_ms},
                         {"age_ms", l.age_ms}});
    }
    out["node"] = config_.node_name;
    out["links"] = std::move(links);
  } else if (command == "quotas" && arg.empty()) {
    Quotas::Counts limits{};
    for (const QuotaSpec& q : kQuotaSpecs)
      limits[static_cast<size_t>(q.quota)] = quotas_.limit(q.quota);
    out["limits"] = ByQuota(limits);
    json bytes = json::array();  // the quotas counted in bytes
    for (const QuotaSpec& q : kQuotaSpecs)
      if (q.unit != 1) bytes.push_back(ResourceName(q));
    out["in_bytes"] = std::move(bytes);
    out["refusals"] = ByQuota(quotas_.refusals());
    json pods = json::array();
    quotas_.ForEachAccount([&](uint32_t ip, const Quotas::Counts& used, const Quotas::Counts&) {
      pods.push_back({{"address", FormatIpv4(ip)}, {"used", ByQuota(used)}});
    });
    out["pods"] = std::move(pods);
  } else if (command == "events" && arg.empty()) {
    json events = json::array();
    for (const EventLog::Entry& e : events_.entries())
      events.push_back({{"unix_ms", e.unix_ms},
                        {"address", e.ip != 0 ? FormatIpv4(e.ip) : ""},
                        {"what", e.what},
                        {"reason", e.reason}});
    out["events"] = std::move(events);
    out["noted"] = events_.noted();
  } else {
    return json{{"error", "unknown command '" + request + "'; one of: " + kCommands}}.dump();
  }
  return out.dump();
}

// Each pod that holds anything: its sessions (processes), what it holds, its refusals and
// its QPs by type.
nlohmann::json Router::AdminPods() const {
  std::map<uint32_t, json> sessions;
  std::map<uint32_t, std::map<std::string, uint64_t>> qps;
  tables_.ForEachPod([&](const Pod& p) {
    sessions[p.who.ip].push_back({{"session", p.id}, {"pid", p.who.pid}});
  });
  for (const auto& [key, n] : tables_.QpsByAddressAndType())
    qps[key.first][QpTypeName(key.second)] = n;
  json pods = json::array();
  quotas_.ForEachAccount(
      [&](uint32_t ip, const Quotas::Counts& used, const Quotas::Counts& refused) {
        json by_type = json::object();
        for (const auto& [type, n] : qps[ip]) by_type[type] = n;
        const std::optional<PodNames::Name> name =
            names_ != nullptr ? names_->Find(ip) : std::nullopt;
        pods.push_back({{"address", FormatIpv4(ip)},
                        {"namespace", name ? name->ns : ""},
                        {"pod", name ? name->pod : ""},
                        {"sessions", sessions.count(ip) ? sessions[ip] : json::array()},
                        {"qps", by_type},
                        {"held", ByQuota(used)},
                        {"refused", ByQuota(refused)}});
      });
  return pods;
}

// Every QP (of the pod at `only`, when not 0): owner, type, the peer its owner named, and
// who produces into its rings.
nlohmann::json Router::AdminQps(uint32_t only) const {
  json qps = json::array();
  tables_.ForEachQp([&](const Qp& q) {
    const Pod* owner = tables_.FindPod(q.owner);
    const uint32_t ip = owner != nullptr ? owner->who.ip : 0;
    if (only != 0 && ip != only) return;
    size_t producers = 0;
    for (const Producer& p : q.producers) producers += p.kind != Producer::Kind::kNone ? 1 : 0;
    json peer = nullptr;
    if (q.named.qpn != proto::kNoId)
      peer = FormatIpv4(q.named.ip) + "/" + std::to_string(q.named.qpn);
    qps.push_back({{"qpn", q.qpn},
                   {"address", ip != 0 ? FormatIpv4(ip) : ""},
                   {"pid", owner != nullptr ? owner->who.pid : 0},
                   {"session", q.owner},
                   {"type", TypeName(q.kind)},
                   {"peer", peer},
                   {"rings", q.num_rings},
                   {"producers", producers}});
  });
  return qps;
}

}  // namespace ff::router
