// Issue 37, attack 1: any pod could kill every QP of another pod's process that owns a UD QP.
// Resolving a UD destination needs no consent, and each resolve that gives the destination's
// ring a new sender sends the destination's process an event with the ring's memfd. The
// attacker resolves the victim's UD QP from one more UD QP of its own than the victim's QP
// has rings, in turn, so that every resolve takes a ring from another of its QPs: an event
// each, as fast as the router answers. The router used to close a destination's event socket
// once it was full, and the library then failed every QP of the victim's process ("lost the
// connection to the router").
//
// The attacker checks that it really made the victim that many new senders; what must hold
// is checked by the suite: the victim keeps its session and its QPs (its library never
// reports a lost router, and the victim's device never reports a fatal error), a fresh pod
// opens its device, and other pods' ping-pongs complete.
#include <chrono>

#include "adversary.h"
#include "freeflow/ipv4.h"
#include "freeflow/tunables.h"

namespace ff::adversary {
namespace {

constexpr auto kFloodFor = std::chrono::seconds(5);
constexpr int kMaxResolves = 200000;
// Fewer than this and the victim's event socket might not have filled: no attack.
constexpr int kEnough = 5000;

}  // namespace

int UdFlood(const Args& a) {
  Report r("37.1", "ud-flood");
  const Rendezvous rv(a.meet);
  auto start = OpenAgainstVictim(a, r);
  if (!start) return Conclude(r, rv);
  RawPod& pod = start->pod;
  std::vector<RawQp> qps;
  for (uint32_t i = 0; i <= kUdRingsPerQp; ++i) {
    qps.push_back(pod.CreateQp(IBV_QPT_UD, kUdRingsPerQp, kUdRingBytes));
    if (qps.back().qpn == 0) {
      r.Check(false, "setting up", "UD QP " + std::to_string(i) + " refused");
      return Conclude(r, rv);
    }
  }
  std::vector<int> statuses;
  int resolved = 0;
  const auto end = std::chrono::steady_clock::now() + kFloodFor;
  for (int i = 0; i < kMaxResolves && std::chrono::steady_clock::now() < end; ++i) {
    const RawQp& q = qps[static_cast<size_t>(i) % qps.size()];
    const RawLink l = pod.Connect(q, start->victim.ip, start->victim.ud_qpn, true);
    if (l.status == 0) {
      ++resolved;
    } else if (statuses.size() < 64) {
      statuses.push_back(l.status);
    }
  }
  r.Check(resolved >= kEnough,
          "resolving the victim's UD QP " + FormatIpv4(start->victim.ip) + ":" +
              std::to_string(start->victim.ud_qpn) + " from " + std::to_string(qps.size()) +
              " UD QPs in turn for " + std::to_string(kFloodFor.count()) +
              " s (each a new sender of a ring: an event for the victim)",
          std::to_string(resolved) + " resolved" +
              (statuses.empty() ? "" : ", refused: " + Tally(statuses)) +
              (resolved >= kEnough ? "" : " (too few to fill its event socket)"));
  return Conclude(r, rv);
}

}  // namespace ff::adversary
