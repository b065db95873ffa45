// Issue 37: what one pod can make its router hold, every quota at its limit at once. The
// docs give one pod's worst case as 72 MiB of router memory (docs/security.md, "Why these
// defaults": 32 MiB queued, 8 MiB of READ data, 64 proxy response rings of 512 KiB); the
// quota attack (finding 8) took the objects one after the other and measured nothing.
//
// The attacker opens one more cross-node channel than its quota allows to the helper on
// node 1 (an RC QP each), posts on every channel READs of the helper's whole region, many
// times over its READ budget, and takes no answer and no event: the response rings fill,
// the router issues no READ whose answer would not fit. It then fills its queued bytes with
// rdma_cm events it never reads, as cm-flood does, and takes every object quota as the quota
// attack does. It holds all of it while the script measures node 0's router: its peak
// resident memory (VmHWM, reset before the attack) may exceed what it held before by at
// most the documented 72 MiB (adversary.sh, during_quota_all).
#include <chrono>
#include <thread>

#include "adversary.h"
#include "freeflow/tunables.h"

namespace ff::adversary {
namespace {

constexpr uint32_t kReadsPerChannel = 64;  // x 64 KiB x 64 channels: 256 MiB asked for

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
  return Conclude(r, rv);
}

}  // namespace ff::adversary
