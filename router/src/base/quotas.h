// Per-pod quotas: what one pod may hold in the router at once, so that a pod that asks for
// too much gets an error and costs the other pods nothing.
//
// A pod is its identity, the overlay address of its network namespace: every process and
// every connection of the pod share one account, so opening more sessions buys nothing.
// Each session keeps a ledger of what it took; closing the session gives all of it back,
// so an account always returns to zero when the pod's last session ends.
//
// Callers take before they hold and give back when they let go. Take() is all or nothing
// and answers with the errno the pod gets (QuotaSpec::error); the first refusal of a pod and
// quota logs one line, later ones within kQuotaLogIntervalNs are only counted.
// Threading: the loop's thread only.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <unordered_map>
#include <utility>

#include "base/event_log.h"

namespace ff::router {

class HandoverState;
using PodId = uint32_t;  // one pod connection (a session), as in resources.h

enum class Quota : uint8_t {
  kSessions,     // connections: processes that opened the device
  kFds,          // descriptors the router keeps on the pod's behalf
  kQps,          // queue pairs
  kObjects,      // CQs, completion channels and SRQs together
  kRegions,      // registered memory regions (one memfd each)
  kMappedBytes,  // bytes of the pod's memory the router maps (for other nodes' access)
  kMrEntries,    // entries of its MR tables
  kPending,      // requests answered later (connects and UD resolves through other nodes)
  kProxies,      // cross-node channels, RC and UD
  kReadBytes,    // READ and atomic data requested from other nodes and not delivered yet
  kQueuedBytes,  // bytes the router queues because the pod does not keep up
  kListeners,    // TCP-mode listening ports registered (socket sessions)
  kStreams,      // TCP-mode connection records it made (SockConnect); held by the pod
};
inline constexpr size_t kQuotaKinds = 13;

// How a quota is configured, and what a pod that reaches it is told.
struct QuotaSpec {
  Quota quota;
  const char* name;  // flag --max-<name>-per-pod, environment FREEFLOW_MAX_<NAME>_PER_POD
  const char* env;
  uint64_t unit;           // bytes per flag unit for byte quotas (MiB), else 1
  uint32_t default_value;  // in flag units
  int error;               // the errno a refused request gets; 0: the request waits
  const char* what;        // for help texts and log lines
};
extern const QuotaSpec kQuotaSpecs[kQuotaKinds];
const QuotaSpec& SpecOf(Quota q);
// A quota's name in metrics and ffctl: its flag's name, byte quotas without their flag's unit
// ("mapped-mib": "mapped", counted in bytes there).
std::string ResourceName(const QuotaSpec& q);

// Lets one log line through per kQuotaLogIntervalNs and counts the ones it holds back, so
// that a client that repeats what gets it refused cannot flood the log.
class LogLimiter {
 public:
  // True when a line may be logged now; *held_back receives how many were not since the last.
  bool Allow(uint64_t* held_back);
  // True while a line logged earlier keeps the next one back.
  bool Quiet() const;

 private:
  uint64_t next_ns_ = 0;
  uint64_t held_back_ = 0;
};

// Limits in flag units, indexed by Quota.
using PodLimits = std::array<uint32_t, kQuotaKinds>;
PodLimits DefaultPodLimits();
// Indexed by Quota: whether a limit was configured rather than left at its default.
using QuotasGiven = std::array<bool, kQuotaKinds>;

struct Charge {
  Quota quota;
  uint64_t n;
};

class Quotas {
 public:
  explicit Quotas(const PodLimits& limits);

  // Opens the ledger of session `session` of the pod at `ip`: takes one session and the
  // descriptor of its socket. 0, or EMFILE when the pod has no session or descriptor left.
  int Open(PodId session, uint32_t ip);
  // Gives back everything `session` still holds and forgets it.
  void Close(PodId session);

  // Takes every charge for `session`, or none. 0, or the errno of the first quota it would
  // exceed (logged). A session without a ledger (never opened) is refused with EACCES.
  int Take(PodId session, std::initializer_list<Charge> charges);
  // Takes one charge without logging a refusal: for limits that make a request wait.
  bool TryTake(PodId session, Charge charge);
  // Gives back, never more than the session holds; nothing for an unknown session.
  void Give(PodId session, std::initializer_list<Charge> charges);
  // What a pod holds beyond its sessions (TCP-mode records live until their connection is
  // gone, after the session that made them): charged to the account of the pod at `ip`
  // directly, all or nothing, refusals logged as Take's. GiveToPod never gives back more
  // than the account holds.
  int TakeForPod(uint32_t ip, std::initializer_list<Charge> charges);
  void GiveToPod(uint32_t ip, std::initializer_list<Charge> charges);

  uint64_t limit(Quota q) const { return limits_[Index(q)]; }  // in units, bytes for bytes
  uint64_t used(uint32_t ip, Quota q) const;
  uint64_t held(PodId session, Quota q) const;
  size_t accounts() const { return accounts_.size(); }  // pods that hold anything
  size_t ledgers() const { return ledgers_.size(); }

  // Indexed by Quota: units held (bytes for byte quotas), or refusals.
  using Counts = std::array<uint64_t, kQuotaKinds>;
  // Where refusals are noted for an admin (ffctl events); nullptr: nowhere. Not owned.
  void set_event_log(EventLog* log) { events_ = log; }
  // Refusals of every pod since the router started, by quota (metrics).
  const Counts& refusals() const { return refusals_; }
  // Calls f(ip, used, refused) for every pod that holds anything: what it holds, and how
  // often it was refused since its account opened (metrics; the account goes with the last
  // thing the pod holds).
  template <typename F>
  void ForEachAccount(F&& f) const {
    for (const auto& [ip, a] : accounts_) f(ip, a.used, a.refused);
  }
  // Hand-over (docs/handover.md): every account and ledger into state.doc["quotas"]; and
  // back, replacing what this one holds (throws HandoverError on a malformed record).
  void Export(HandoverState& state) const;
  void Import(const HandoverState& state);

 private:
  struct Account {
    Counts used{};
    Counts refused{};
  };
  using RefusalLogs = std::array<LogLimiter, kQuotaKinds>;
  struct Ledger {
    uint32_t ip = 0;
    Counts held{};
  };
  static size_t Index(Quota q) { return static_cast<size_t>(q); }
  int Refuse(uint32_t ip, Account& a, Quota q, uint64_t n);
  // Adds every charge to account `a` of the pod at `ip`, or none (0 or the refusal's errno).
  int ChargeAccount(uint32_t ip, Account& a, std::initializer_list<Charge> charges);
  void GiveOne(Ledger& l, Account& a, Quota q, uint64_t n);
  void ForgetIfEmpty(uint32_t ip);

  Counts limits_{};
  Counts refusals_{};
  EventLog* events_ = nullptr;
  std::unordered_map<uint32_t, Account> accounts_;  // by overlay address
  // Each pod's refusal lines, by overlay address: kept while a window is open even when
  // its account goes (a pod that drops to nothing and comes back gets no fresh window).
  std::unordered_map<uint32_t, RefusalLogs> refusal_logs_;
  std::unordered_map<PodId, Ledger> ledgers_;       // by session
};

// Units of one quota that one object holds for a session (a variable amount, such as the
// bytes it queued); whatever it still holds is given back when it is destroyed. The Quotas
// must outlive it.
class Held {
 public:
  Held() = default;
  Held(Quotas& quotas, PodId session, Quota quota)
      : quotas_(&quotas), session_(session), quota_(quota) {}
  Held(Held&& o) noexcept { *this = std::move(o); }
  Held& operator=(Held&& o) noexcept;
  Held(const Held&) = delete;
  Held& operator=(const Held&) = delete;
  ~Held() { Give(n_); }

  // Takes `n` more: 0 or the errno of the refusal (logged). EACCES when unbound.
  int Take(uint64_t n);
  void Give(uint64_t n);  // at most what it holds
  uint64_t n() const { return n_; }

 private:
  Quotas* quotas_ = nullptr;
  PodId session_ = 0;
  Quota quota_ = Quota::kSessions;
  uint64_t n_ = 0;
};

}  // namespace ff::router
