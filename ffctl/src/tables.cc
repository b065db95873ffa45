#include "tables.h"

#include <fmt/format.h>
#include <time.h>

#include <algorithm>
#include <vector>

namespace ff::ctl {
namespace {

using nlohmann::json;
using Row = std::vector<std::string>;

// Columns as wide as their widest cell, two spaces apart; the last one unpadded.
std::string Render(const Row& header, const std::vector<Row>& rows) {
  std::vector<size_t> width(header.size());
  for (size_t i = 0; i < header.size(); ++i) width[i] = header[i].size();
  for (const Row& r : rows)
    for (size_t i = 0; i < r.size() && i < width.size(); ++i)
      width[i] = std::max(width[i], r[i].size());
  std::string out;
  auto line = [&](const Row& r) {
    for (size_t i = 0; i < r.size(); ++i) {
      out += r[i];
      if (i + 1 < r.size()) out += std::string(width[i] - r[i].size() + 2, ' ');
    }
    out += '\n';
  };
  line(header);
  for (const Row& r : rows) line(r);
  return out;
}

std::string Num(const json& v) { return v.is_number() ? v.dump() : "-"; }

std::string Mib(uint64_t bytes) { return fmt::format("{:.1f}", bytes / 1048576.0); }

std::string PodsTable(const json& a) {
  std::vector<Row> rows;
  for (const json& p : a.at("pods")) {
    std::string pids, qps;
    for (const json& s : p.at("sessions")) pids += (pids.empty() ? "" : ",") + Num(s.at("pid"));
    for (const auto& [type, n] : p.at("qps").items())
      qps += (qps.empty() ? "" : " ") + type + ":" + Num(n);
    const json& held = p.at("held");
    uint64_t refused = 0;
    for (const auto& [quota, n] : p.at("refused").items()) refused += n.get<uint64_t>();
    // The namespace and name the container runtime gives it (the router's --cri-endpoint).
    const std::string ns = p.value("namespace", ""), pod = p.value("pod", "");
    rows.push_back({p.at("address").get<std::string>(), pod.empty() ? "-" : ns + "/" + pod,
                    Num(held.at("sessions")), pids.empty() ? "-" : pids, qps.empty() ? "-" : qps,
                    Num(held.at("objects")), Num(held.at("regions")),
                    Mib(held.at("mapped").get<uint64_t>()), Num(held.at("streams")),
                    Num(held.at("sock-listeners")), std::to_string(refused)});
  }
  return Render({"ADDRESS", "POD", "SESSIONS", "PIDS", "QPS", "OBJECTS", "REGIONS", "MAPPED-MIB",
                 "TCP-CONNS", "TCP-LISTENERS", "REFUSED"},
                rows);
}

std::string QpsTable(const json& a) {
  std::vector<Row> rows;
  for (const json& q : a.at("qps"))
    rows.push_back({Num(q.at("qpn")), q.at("address").get<std::string>(), Num(q.at("pid")),
                    q.at("type").get<std::string>(),
                    q.at("peer").is_null() ? "-" : q.at("peer").get<std::string>(),
                    Num(q.at("rings")), Num(q.at("producers"))});
  std::sort(rows.begin(), rows.end(),
            [](const Row& x, const Row& y) { return std::stoull(x[0]) < std::stoull(y[0]); });
  return Render({"QPN", "ADDRESS", "PID", "TYPE", "PEER", "RINGS", "PRODUCERS"}, rows);
}

std::string LinksTable(const json& a) {
  std::vector<Row> rows;
  for (const json& l : a.at("links"))
    rows.push_back({Num(l.at("id")), l.at("peer").get<std::string>(),
                    l.at("dialled").get<bool>() ? "dialled" : "accepted",
                    l.at("state").get<std::string>(), Num(l.at("queued_bytes")),
                    Num(l.at("idle_ms")), Num(l.at("age_ms"))});
  return fmt::format("node {}: {} links\n", a.at("node").get<std::string>(), rows.size()) +
         Render({"ID", "PEER", "DIRECTION", "STATE", "QUEUED-BYTES", "IDLE-MS", "AGE-MS"}, rows);
}

std::string QuotasTable(const json& a) {
  std::vector<Row> rows;
  // The quotas the router counts in bytes, in MiB, as their flags take them.
  const json& in_bytes = a.at("in_bytes");
  const auto cell = [&](const std::string& quota, const json& v) {
    const bool bytes = std::find(in_bytes.begin(), in_bytes.end(), quota) != in_bytes.end();
    return bytes ? Mib(v.get<uint64_t>()) + " MiB" : Num(v);
  };
  for (const auto& [quota, limit] : a.at("limits").items()) {
    std::string top = "-";
    uint64_t most = 0;
    for (const json& p : a.at("pods")) {
      const uint64_t used = p.at("used").at(quota).get<uint64_t>();
      if (used > most) {
        most = used;
        top = p.at("address").get<std::string>() + " " + cell(quota, used);
      }
    }
    rows.push_back({quota, cell(quota, limit), Num(a.at("refusals").at(quota)), top});
  }
  return Render({"QUOTA", "LIMIT-PER-POD", "REFUSALS", "MOST-HELD-BY"}, rows);
}

std::string EventsTable(const json& a) {
  std::vector<Row> rows;
  for (const json& e : a.at("events")) {
    const uint64_t ms = e.at("unix_ms").get<uint64_t>();
    const time_t secs = static_cast<time_t>(ms / 1000);
    tm utc{};
    ::gmtime_r(&secs, &utc);
    char when[32];
    std::strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &utc);
    rows.push_back(
        {fmt::format("{}.{:03}Z", when, ms % 1000),
         e.at("address").get<std::string>().empty() ? "-" : e.at("address").get<std::string>(),
         e.at("what").get<std::string>(), e.at("reason").get<std::string>()});
  }
  return fmt::format("{} refusals noted since the router started; the last {}:\n",
                     a.at("noted").get<uint64_t>(), rows.size()) +
         Render({"TIME", "ADDRESS", "WHAT", "REASON"}, rows);
}

}  // namespace

std::string Table(const std::string& command, const json& answer) {
  if (command == "pods") return PodsTable(answer);
  if (command == "qps") return QpsTable(answer);
  if (command == "links") return LinksTable(answer);
  if (command == "quotas") return QuotasTable(answer);
  if (command == "events") return EventsTable(answer);
  return answer.dump(2) + "\n";
}

}  // namespace ff::ctl
