// Issue 37: what one pod can make its router hold, every quota at its limit at once. The
// docs give one pod's worst case as 72 MiB of router memory (docs/security.md, "Why these
// defaults": 32 MiB queued, 8 MiB of READ data, 64 proxy response rings of 512 KiB); the
// quota attack (finding 8) took the objects one after the other and measured nothing.
//
// The attacker opens one more cross-node channel than its quota allows to the helper on
// node 1 (an RC QP each) and has the helper write a byte into each of 65 regions of 1 GiB
// (node 0's router maps each for it: mapped-mib, 64 GiB, refuses the last ones). It posts
// on every channel READs of the helper's whole region, many times over its READ budget, and
// takes no answer and no event: the response rings fill, the router issues no READ whose
// answer would not fit. It then fills its queued bytes with rdma_cm events it never reads,
// as cm-flood does, takes every object quota as the quota attack does, and last leaves 64
// connects to an address no node holds waiting (pending; the 65th refused at once). It holds all of
// it while the script measures node 0's router: its peak resident memory (VmHWM, reset before the
// attack) may exceed what it held before by at most the documented 72 MiB (adversary.sh,
// during_quota_all).
#include <chrono>
#include <sstream>
#include <thread>

#include "adversary.h"
#include "freeflow/ipv4.h"
#include "freeflow/tunables.h"

namespace ff::adversary {
namespace {

constexpr uint32_t kReadsPerChannel = 64;  // x 64 KiB x 64 channels: 256 MiB asked for
// Regions the helper writes a byte into, each mapped by node 0's router for it: one more
// than mapped-mib holds.
constexpr uint64_t kRegionBytes = uint64_t{1} << 30;
constexpr uint32_t kRegions = kDefaultPodMappedMiB / 1024 + 1;
constexpr uint32_t kFirstRegion = 100000;  // clear of the ids TakeAllObjects uses
constexpr uint64_t kRegionBase = uint64_t{1} << 44;

// Registers kRegions sparse regions of kRegionBytes (kept in *memory) and has the helper
// write a byte into each: node 0's router maps every one it serves, charged to mapped-mib,
// until the quota refuses (IBV_WC_REM_ACCESS_ERR at the helper).
void FillMapped(RawPod& pod, const Rendezvous& rv, Report& r, std::vector<Mapping>* memory) {
  memory->resize(kRegions);
  std::string list;
  for (uint32_t i = 0; i < kRegions; ++i) {
    const uint64_t addr = kRegionBase + i * kRegionBytes;
    const uint32_t key =
        pod.Register(kFirstRegion + i, kRegionBytes, kAllAccess, addr, &(*memory)[i]);
    if (key == 0) {
      r.Check(false, "registering " + std::to_string(kRegions) + " regions of 1 GiB",
              "region " + std::to_string(i) + " refused");
      return;
    }
    list += std::to_string(key) + " " + std::to_string(addr) + " ";
  }
  rv.Put("regions", list);
  const auto writes = rv.Get("writes", std::chrono::seconds(60));
  std::vector<int> statuses;
  if (writes) {
    std::istringstream in(*writes);
    for (int st; in >> st;) statuses.push_back(st);
  }
  size_t served = 0;
  while (served < statuses.size() && statuses[served] == IBV_WC_SUCCESS) ++served;
  bool rest_refused = served < statuses.size();
  for (size_t i = served; i < statuses.size(); ++i)
    rest_refused = rest_refused && statuses[i] == IBV_WC_REM_ACCESS_ERR;
  // Its QP segments are mapped for node 1 too: the last whole GiB may not fit.
  const size_t quota_gib = kDefaultPodMappedMiB / 1024;
  r.Check(statuses.size() == kRegions && served + 1 >= quota_gib && rest_refused,
          "the helper WRITEs a byte into each of " + std::to_string(kRegions) +
              " regions of 1 GiB (node 0's router maps each: mapped-mib " +
              std::to_string(kDefaultPodMappedMiB) + ")",
          writes ? std::to_string(served) + " written, then " +
                       (served < statuses.size() ? WcName(statuses[served]) : "nothing") + " x" +
                       std::to_string(statuses.size() - served)
                 : "the helper never answered");
}

// Requests the router answers later, until the pending quota refuses one: connects to an
// address of the pod network that no node holds wait --resolve-timeout-ms each.
void FillPending(RawPod& pod, const RawQp& qp, Report& r) {
  const uint32_t own = OwnIp(pod);
  const uint32_t len = pod.hello().prefix_len;
  const uint32_t mask = len == 0 ? 0 : ~uint32_t{0} << (32 - len);
  const uint32_t nobody = (own & mask) | (~mask & 0xfffffffe);
  proto::ConnectQp m{};
  m.h.op = proto::Op::kConnectQp;
  m.qpn = qp.qpn;
  m.dest_ip = htonl(nobody);
  m.dest_qpn = 1;
  for (uint32_t i = 0; i < kDefaultPodPending; ++i) pod.SendRaw(&m, sizeof(m));
  const int last = pod.Call(m).status;
  r.Check(last == EAGAIN,
          std::to_string(kDefaultPodPending + 1) + " connects to " + FormatIpv4(nobody) +
              " (no node holds it: each waits), unanswered",
          "the last answered " + ErrName(last) + " at once");
}

ProxyRequest Read(uint32_t seq, const Peer& peer) {
  return ProxyRequest{.remote_addr = peer.addr,
                      .compare_add = 0,
                      .swap = 0,
                      .rkey = peer.rkey,
                      .seq = seq,
                      .length = kPeerRegionBytes,
                      .opcode = IBV_WR_RDMA_READ,
                      .last = 1,
                      .rnr_retry = 7,
                      .reserved = 0};
}

}  // namespace

int QuotaAll(const Args& a) {
  Report r("37.m", "quota-all");
  const Rendezvous rv(a.meet);
  RaiseDescriptorLimit();
  RawPod pod = OpenPod();
  const int hello = pod.Hello(Abi());
  if (hello != 0) {
    r.Check(false, "setting up", "HELLO: " + ErrName(hello));
    return Conclude(r, rv);
  }
  // Cross-node channels: one more than the quota.
  std::vector<RawQp> qps;
  std::vector<RawQp*> ours;
  for (uint32_t i = 0; i <= kDefaultPodProxies; ++i) {
    qps.push_back(pod.CreateQp(IBV_QPT_RC));
    qps.back().hdr()->credits.posted.store(1u << 16);  // the helper's SEND finds a receive
    qps.back().hdr()->qp_access.store(kAllAccess);     // and its WRITEs may reach our regions
  }
  for (RawQp& q : qps) ours.push_back(&q);
  const std::optional<Peer> peer = MeetPeer(rv, pod, ours);
  if (!peer) {
    r.Check(false, "setting up", "the helper on node 1 never answered");
    return Conclude(r, rv);
  }
  std::vector<RawLink> links;
  int refusal = -1;
  for (size_t i = 0; i < qps.size(); ++i) {
    RawLink l = ConnectTo(pod, qps[i], peer->ip, peer->qpns[i]);
    if (l.status == 0) {
      links.push_back(std::move(l));
    } else if (refusal == -1) {
      refusal = l.status;
    }
  }
  r.Check(links.size() == kDefaultPodProxies && refusal == ENOSPC,
          "connecting " + std::to_string(qps.size()) + " RC QPs to the helper on node 1",
          std::to_string(links.size()) + " cross-node channels, then " + ErrName(refusal));
  std::vector<Mapping> regions;
  FillMapped(pod, rv, r, &regions);
  // READs of the helper's region on every channel, never answered by this pod.
  uint64_t posted = 0;
  for (uint32_t round = 0; round < kReadsPerChannel; ++round) {
    for (RawLink& l : links) {
      posted += test::TryPostRequest(l, kRecReadReq, 0, Read(round, *peer), nullptr, 0,
                                     std::chrono::milliseconds(0))
                    ? 1
                    : 0;
    }
  }
  const uint64_t asked_mib = posted * kPeerRegionBytes >> 20;
  r.Check(asked_mib > 2 * (kDefaultPodQueuedMiB + kDefaultPodReadMiB),
          "READs of " + std::to_string(kPeerRegionBytes >> 10) +
              " KiB on every channel, no answer taken",
          std::to_string(posted) + " posted (" + std::to_string(asked_mib) + " MiB asked for)");
  std::this_thread::sleep_for(std::chrono::seconds(2));  // the answers come and wait
  // Events never read, until the pod's queued bytes are full.
  const CmFloodResult cm = FloodCmEvents(pod);
  r.Check(CmFloodHeld(cm), kCmFloodTried, DescribeCmFlood(cm));
  std::vector<RawPod> sessions;
  TakeAllObjects(pod, r, &sessions);
  FillPending(pod, qps.back(), r);
  return Conclude(r, rv);
}

}  // namespace ff::adversary
