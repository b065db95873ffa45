#include "base/quotas.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "base/handover_state.h"
#include "freeflow/ipv4.h"
#include "freeflow/target_ops.h"
#include "freeflow/tunables.h"

namespace ff::router {

// Counts of things a device refuses when it runs out: ENOSPC; descriptors and sessions, as a
// process out of descriptors: EMFILE; a mapping: ENOMEM; a request that cannot wait for its
// answer now: EAGAIN; the router's queues: ENOBUFS (the pod sees error completions).
const QuotaSpec kQuotaSpecs[kQuotaKinds] = {
    {Quota::kSessions, "sessions", "FREEFLOW_MAX_SESSIONS_PER_POD", 1, kDefaultPodSessions, EMFILE,
     "sessions (processes with the device open)"},
    {Quota::kFds, "fds", "FREEFLOW_MAX_FDS_PER_POD", 1, kDefaultPodFds, EMFILE,
     "descriptors the router holds for it"},
    {Quota::kQps, "qps", "FREEFLOW_MAX_QPS_PER_POD", 1, kDefaultPodQps, ENOSPC, "queue pairs"},
    {Quota::kObjects, "objects", "FREEFLOW_MAX_OBJECTS_PER_POD", 1, kDefaultPodObjects, ENOSPC,
     "CQs, completion channels and SRQs"},
    {Quota::kRegions, "regions", "FREEFLOW_MAX_REGIONS_PER_POD", 1, kDefaultPodRegions, ENOSPC,
     "registered memory regions"},
    {Quota::kMappedBytes, "mapped-mib", "FREEFLOW_MAX_MAPPED_MIB_PER_POD", 1u << 20,
     kDefaultPodMappedMiB, ENOMEM, "bytes of its memory mapped by the router"},
    {Quota::kMrEntries, "mrs", "FREEFLOW_MAX_MRS_PER_POD", 1, kDefaultPodMrEntries, ENOSPC,
     "memory registrations"},
    {Quota::kPending, "pending", "FREEFLOW_MAX_PENDING_PER_POD", 1, kDefaultPodPending, EAGAIN,
     "requests waiting for another node"},
    {Quota::kProxies, "proxies", "FREEFLOW_MAX_PROXIES_PER_POD", 1, kDefaultPodProxies, ENOSPC,
     "cross-node channels"},
    {Quota::kReadBytes, "read-mib", "FREEFLOW_MAX_READ_MIB_PER_POD", 1u << 20, kDefaultPodReadMiB,
     0, "bytes of READ and atomic data in flight"},
    {Quota::kQueuedBytes, "queued-mib", "FREEFLOW_MAX_QUEUED_MIB_PER_POD", 1u << 20,
     kDefaultPodQueuedMiB, ENOBUFS, "bytes queued because it does not keep up"},
    {Quota::kListeners, "sock-listeners", "FREEFLOW_MAX_SOCK_LISTENERS_PER_POD", 1,
     kMaxSockListenersPerPod, ENOSPC, "TCP-mode listening ports"},
    {Quota::kStreams, "streams", "FREEFLOW_MAX_STREAMS_PER_POD", 1, kMaxStreamRecordsPerPod, ENOSPC,
     "TCP-mode connections it made"},
};

const QuotaSpec& SpecOf(Quota q) { return kQuotaSpecs[static_cast<size_t>(q)]; }

std::string ResourceName(const QuotaSpec& q) {
  std::string name = q.name;
  if (q.unit != 1 && name.ends_with("-mib")) name.resize(name.size() - 4);
  return name;
}

PodLimits DefaultPodLimits() {
  PodLimits l{};
  for (const QuotaSpec& s : kQuotaSpecs) l[static_cast<size_t>(s.quota)] = s.default_value;
  return l;
}

Quotas::Quotas(const PodLimits& limits) {
  for (const QuotaSpec& s : kQuotaSpecs) {
    const size_t i = Index(s.quota);
    limits_[i] = static_cast<uint64_t>(limits[i]) * s.unit;
  }
}

int Quotas::Open(PodId session, uint32_t ip) {
  ledgers_.erase(session);
  Ledger& l = ledgers_[session];
  l.ip = ip;
  const int rc = Take(session, {{Quota::kSessions, 1}, {Quota::kFds, 1}});
  if (rc != 0) {
    ledgers_.erase(session);
    ForgetIfEmpty(ip);
  }
  return rc;
}

void Quotas::Close(PodId session) {
  auto it = ledgers_.find(session);
  if (it == ledgers_.end()) return;
  const uint32_t ip = it->second.ip;
  auto acc = accounts_.find(ip);
  if (acc != accounts_.end()) {
    for (size_t i = 0; i < kQuotaKinds; ++i)
      GiveOne(it->second, acc->second, static_cast<Quota>(i), it->second.held[i]);
  }
  ledgers_.erase(it);
  ForgetIfEmpty(ip);
}

int Quotas::Take(PodId session, std::initializer_list<Charge> charges) {
  auto it = ledgers_.find(session);
  if (it == ledgers_.end()) return EACCES;
  Ledger& l = it->second;
  if (const int rc = ChargeAccount(l.ip, accounts_[l.ip], charges)) return rc;
  for (const Charge& c : charges) l.held[Index(c.quota)] += c.n;
  return 0;
}

int Quotas::TakeForPod(uint32_t ip, std::initializer_list<Charge> charges) {
  const int rc = ChargeAccount(ip, accounts_[ip], charges);
  if (rc != 0) ForgetIfEmpty(ip);
  return rc;
}

void Quotas::GiveToPod(uint32_t ip, std::initializer_list<Charge> charges) {
  auto acc = accounts_.find(ip);
  if (acc == accounts_.end()) return;
  for (const Charge& c : charges) {
    uint64_t& used = acc->second.used[Index(c.quota)];
    used -= std::min(c.n, used);
  }
  ForgetIfEmpty(ip);
}

int Quotas::ChargeAccount(uint32_t ip, Account& a, std::initializer_list<Charge> charges) {
  for (const Charge& c : charges) {
    const size_t i = Index(c.quota);
    if (c.n > limits_[i] || a.used[i] > limits_[i] - c.n) return Refuse(ip, a, c.quota, c.n);
  }
  for (const Charge& c : charges) a.used[Index(c.quota)] += c.n;
  return 0;
}

bool Quotas::TryTake(PodId session, Charge c) {
  auto it = ledgers_.find(session);
  if (it == ledgers_.end()) return false;
  Ledger& l = it->second;
  Account& a = accounts_[l.ip];
  const size_t i = Index(c.quota);
  if (c.n > limits_[i] || a.used[i] > limits_[i] - c.n) return false;
  a.used[i] += c.n;
  l.held[i] += c.n;
  return true;
}

void Quotas::Give(PodId session, std::initializer_list<Charge> charges) {
  auto it = ledgers_.find(session);
  if (it == ledgers_.end()) return;
  auto acc = accounts_.find(it->second.ip);
  if (acc == accounts_.end()) return;
  for (const Charge& c : charges) GiveOne(it->second, acc->second, c.quota, c.n);
}

void Quotas::GiveOne(Ledger& l, Account& a, Quota q, uint64_t n) {
  const size_t i = Index(q);
  n = std::min(n, l.held[i]);
  l.held[i] -= n;
  a.used[i] -= std::min(n, a.used[i]);
}

// An account lives while its pod holds anything (every open session holds itself). Its
// refusal lines' windows outlive it: a pod that opens and closes sessions again and again
// would otherwise log a line per refusal. Windows that are over go with their account, or
// when more pods have them than hold anything.
void Quotas::ForgetIfEmpty(uint32_t ip) {
  auto it = accounts_.find(ip);
  if (it == accounts_.end()) return;
  for (uint64_t n : it->second.used)
    if (n != 0) return;
  accounts_.erase(it);
  const auto over = [](const RefusalLogs& logs) {
    return std::none_of(logs.begin(), logs.end(), [](const LogLimiter& l) { return l.Quiet(); });
  };
  if (auto logs = refusal_logs_.find(ip); logs != refusal_logs_.end() && over(logs->second))
    refusal_logs_.erase(logs);
  if (refusal_logs_.size() > accounts_.size() + 64) {
    std::erase_if(refusal_logs_,
                  [&](const auto& e) { return !accounts_.contains(e.first) && over(e.second); });
  }
}

bool LogLimiter::Quiet() const { return MonotonicNs() < next_ns_; }

bool LogLimiter::Allow(uint64_t* held_back) {
  const uint64_t now = MonotonicNs();
  if (now < next_ns_) {
    ++held_back_;
    return false;
  }
  next_ns_ = now + kQuotaLogIntervalNs;
  *held_back = std::exchange(held_back_, 0);
  return true;
}

int Quotas::Refuse(uint32_t ip, Account& a, Quota q, uint64_t n) {
  const size_t i = Index(q);
  const QuotaSpec& s = SpecOf(q);
  ++a.refused[i];
  ++refusals_[i];
  if (events_ != nullptr) {
    events_->Note(ip, std::string("quota ") + s.name,
                  fmt::format("over its quota of {} ({} held, {} more asked, limit {}): {}", s.what,
                              a.used[i], n, limits_[i], std::strerror(s.error)));
  }
  uint64_t held_back = 0;
  if (refusal_logs_[ip][i].Allow(&held_back)) {
    spdlog::warn(
        "pod {}: over its quota of {} ({} held, {} more asked, limit {}; --max-{}-per-pod): "
        "refused with {} ({} more refusals since the last line)",
        FormatIpv4(ip), s.what, a.used[i], n, limits_[i], s.name, std::strerror(s.error),
        held_back);
  }
  return s.error;
}

uint64_t Quotas::used(uint32_t ip, Quota q) const {
  auto it = accounts_.find(ip);
  return it == accounts_.end() ? 0 : it->second.used[Index(q)];
}

uint64_t Quotas::held(PodId session, Quota q) const {
  auto it = ledgers_.find(session);
  return it == ledgers_.end() ? 0 : it->second.held[Index(q)];
}

Held& Held::operator=(Held&& o) noexcept {
  if (this != &o) {
    Give(n_);
    quotas_ = std::exchange(o.quotas_, nullptr);
    session_ = o.session_;
    quota_ = o.quota_;
    n_ = std::exchange(o.n_, 0);
  }
  return *this;
}

int Held::Take(uint64_t n) {
  if (quotas_ == nullptr) return EACCES;
  const int rc = quotas_->Take(session_, {{quota_, n}});
  if (rc == 0) n_ += n;
  return rc;
}

void Held::Give(uint64_t n) {
  n = std::min(n, n_);
  if (n == 0 || quotas_ == nullptr) return;
  quotas_->Give(session_, {{quota_, n}});
  n_ -= n;
}

namespace {

nlohmann::json CountsJson(const Quotas::Counts& c) { return nlohmann::json(c); }

Quotas::Counts CountsOf(const nlohmann::json& j, const char* key) {
  const nlohmann::json& a = HandoverState::Array(j, key, kQuotaKinds);
  if (a.size() != kQuotaKinds) throw HandoverError(std::string("field '") + key + "' is short");
  Quotas::Counts c{};
  for (size_t i = 0; i < kQuotaKinds; ++i) {
    if (!a[i].is_number_unsigned()) throw HandoverError(std::string("a count of '") + key + "'");
    c[i] = a[i].get<uint64_t>();
  }
  return c;
}

}  // namespace

void Quotas::Export(HandoverState& state) const {
  nlohmann::json accounts = nlohmann::json::array(), ledgers = nlohmann::json::array();
  for (const auto& [ip, a] : accounts_)
    accounts.push_back(
        {{"ip", ip}, {"used", CountsJson(a.used)}, {"refused", CountsJson(a.refused)}});
  for (const auto& [session, l] : ledgers_)
    ledgers.push_back({{"session", session}, {"ip", l.ip}, {"held", CountsJson(l.held)}});
  state.doc["quotas"] = {{"accounts", std::move(accounts)},
                         {"ledgers", std::move(ledgers)},
                         {"refusals", CountsJson(refusals_)}};
}

void Quotas::Import(const HandoverState& state) {
  const nlohmann::json& q = HandoverState::Object(state.doc, "quotas");
  constexpr size_t kMax = 1u << 20;
  decltype(accounts_) accounts;
  decltype(ledgers_) ledgers;
  for (const nlohmann::json& a : HandoverState::Array(q, "accounts", kMax)) {
    Account& to = accounts[HandoverState::U32(a, "ip")];
    to.used = CountsOf(a, "used");
    to.refused = CountsOf(a, "refused");
  }
  for (const nlohmann::json& l : HandoverState::Array(q, "ledgers", kMax)) {
    Ledger& to = ledgers[HandoverState::U32(l, "session")];
    to.ip = HandoverState::U32(l, "ip");
    to.held = CountsOf(l, "held");
    // A ledger's charges are part of its pod's account: never more than the account holds.
    const auto acc = accounts.find(to.ip);
    for (size_t i = 0; i < kQuotaKinds; ++i) {
      if (to.held[i] != 0 && (acc == accounts.end() || acc->second.used[i] < to.held[i]))
        throw HandoverError("a session holds more than its pod's account");
    }
  }
  refusals_ = CountsOf(q, "refusals");
  accounts_ = std::move(accounts);
  ledgers_ = std::move(ledgers);
}

}  // namespace ff::router
