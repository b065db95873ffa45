// What a verbs session's library claims it carried out, from its traffic ledger
// (freeflow/traffic_ledger.h): the pod moves its data without the router, so this is the
// only place the router learns of it. The ledger is the pod's memory and the pod's word: the
// router maps it read-only, reads each slot once per read, and takes from it only what an
// honest library could have written since the last read (docs/metrics.md, "Traffic"):
//   - a count never goes down: a slot whose count fell is not believed until it passes the
//     highest value taken (`decrease`);
//   - a slot keeps the key (peer, placement) it was first read with, and its placement is
//     one of TrafficPlacement (`key`);
//   - what all of a session's slots gained together since the last read is at most
//     kMaxClaimedBytesPerNs bytes and kMaxClaimedOpsPerNs operations per nanosecond of it;
//     the rest is not taken, ever (`rate`).
// What is taken goes to a TrafficSink, which labels it with what the router knows itself.
// Threading: the loop's thread only.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <vector>

#include "base/reason_counts.h"
#include "freeflow/fd.h"
#include "freeflow/traffic_ledger.h"

namespace ff::router {

class HandoverState;

// Where what the ledgers gained goes: `ops` work requests of `kind` with `bytes` of payload
// to `peer_ip` (host order; 0: several peers) at `placement`.
class TrafficSink {
 public:
  virtual ~TrafficSink() = default;
  virtual void Claimed(TrafficPlacement placement, uint32_t peer_ip, TrafficKind kind, uint64_t ops,
                       uint64_t bytes) = 0;
};

enum class ClaimRefusal : uint8_t { kDecrease, kKey, kRate, kLedger };
using ClaimRefusals = ReasonCounts<ClaimRefusal, 4>;
// kLedger: a ledger not taken (not a sealed segment of its size, or a second one).
inline constexpr std::array<const char*, 4> kClaimRefusalNames = {"decrease", "key", "rate",
                                                                  "ledger"};

// More than one process can move (memory bandwidth of a large server): 256 GB/s, and one
// operation a nanosecond.
inline constexpr uint64_t kMaxClaimedBytesPerNs = 256;
inline constexpr uint64_t kMaxClaimedOpsPerNs = 1;

class TrafficClaims {
 public:
  // Maps the ledger the session handed over, read-only. EINVAL when it is not a sealed
  // segment of kTrafficLedgerBytes, or when one was taken already.
  int Take(int fd, uint64_t now_ns);
  bool taken() const { return map_.get() != nullptr; }
  // Hand-over (pods/handover.cc): the ledger and how far reads got; and back.
  nlohmann::json Export(HandoverState& state) const;
  void Import(HandoverState& state, const nlohmann::json& j);
  // Takes what the ledger gained since the last read to `sink`, counting what it refuses.
  void Read(uint64_t now_ns, TrafficSink& sink, ClaimRefusals& refusals);

 private:
  struct Seen {
    uint32_t peer_ip = 0;
    uint32_t placement = 0;
    uint64_t ops[kTrafficKinds] = {};
    uint64_t bytes[kTrafficKinds] = {};
  };
  Mapping map_;
  std::vector<Seen> seen_;  // by slot, as far as a read got
  uint64_t read_ns_ = 0;    // the last read (or the take)
};

}  // namespace ff::router
