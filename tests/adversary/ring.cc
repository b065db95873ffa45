// Finding 4: a ring producer that trusts the indices its consumer left in shared memory can
// be steered outside the ring. Two attacks on the routers' producers:
// - as a target: the attacker leaves its QP's ring indices misaligned 8 bytes before the end
//   (tail = head = ring size - 8) with a canary in the next ring's header; a SEND from the
//   other node makes the router produce into that ring. The canary and the indices must stay
//   untouched, the sender get an error, and SENDs into its other QPs succeed;
// - as an initiator: it sets the head of its proxy's response ring to 8 (misaligned, past the
//   tail) and asks for more READ answers than the ring holds. The router must stay within
//   the ring and go on answering the attacker's other QP.
#include <unistd.h>

#include <cstring>
#include <thread>

#include "adversary.h"

namespace ff::adversary {
namespace {

constexpr uint32_t kReads = 24;
constexpr uint32_t kReadBytes = 32 * 1024;
constexpr char kCanaryByte = 0x5a;

void SetTrap(const RawQp& qp) {
  RingHeader* ring = qp.ring(0);
  ring->tail.store(kMinRingBytes - 8);
  ring->head.store(kMinRingBytes - 8);
  std::memset(static_cast<void*>(qp.ring(1)), kCanaryByte, sizeof(RingHeader));
}

bool TrapUntouched(const RawQp& qp) {
  const auto* canary = reinterpret_cast<const char*>(qp.ring(1));
  for (size_t i = 0; i < sizeof(RingHeader); ++i)
    if (canary[i] != kCanaryByte) return false;
  return qp.ring(0)->tail.load() == kMinRingBytes - 8 &&
         qp.ring(0)->head.load() == kMinRingBytes - 8;
}

// Asks for kReads READs of the helper's region on `link`; returns how many were posted.
uint32_t FloodReads(RawLink& link, const Peer& peer) {
  uint32_t posted = 0;
  for (; posted < kReads; ++posted) {
    ProxyRequest q{};
    q.opcode = IBV_WR_RDMA_READ;
    q.rkey = peer.rkey;
    q.remote_addr = peer.addr;
    q.length = kReadBytes;
    q.seq = posted;
    q.last = 1;
    if (test::PostRequest(link, kRecReadReq, kRecFirst | kRecLast, q) != RingStatus::kOk) break;
  }
  return posted;
}

// The initiator's side: a corrupt response ring on one proxy, then a SEND on another.
void CorruptResponses(RawPod& pod, RawQp& flooded, RawQp& control, const Peer& peer, Report& r) {
  RawLink flood = ConnectTo(pod, flooded, peer.ip, peer.qpns[1]);
  RawLink other = ConnectTo(pod, control, peer.ip, peer.qpns[2]);
  if (flood.status != 0 || other.status != 0) {
    r.Check(false, "connecting its QPs to the helper's",
            ErrName(flood.status) + ", " + ErrName(other.status));
    return;
  }
  const uint32_t bytes = flood.reply.ring_bytes;
  RingHeader* responses = QpRing(flood.seg.get(), kProxyResponseRing, bytes);
  responses->head.store(8);
  const uint32_t posted = FloodReads(flood, peer);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const uint64_t written = responses->tail.load();
  std::optional<ProxyResponse> answer;
  if (test::PostSend(other, 1, "still served?") == RingStatus::kOk)
    answer = test::NextAnswer(other);
  const int got = answer ? answer->status : -1;
  r.Check(posted == kReads && written > 0 && written <= bytes && got == IBV_WC_SUCCESS,
          std::to_string(posted) +
              " READs of 32 KiB whose answers go to a response ring whose head "
              "it set to 8 (misaligned, past the tail)",
          "the router produced " + std::to_string(written) + " bytes into a ring of " +
              std::to_string(bytes) + "; its other QP's SEND: " + WcName(got));
}

}  // namespace

int Ring(const Args& a) {
  Report r("4", "ring");
  const Rendezvous rv(a.meet);
  RawPod pod = OpenPod();
  if (pod.Hello(Abi()) != 0) {
    r.Check(false, "setting up", "HELLO refused");
    return r.Finish();
  }
  RawQp trap = pod.CreateQp(IBV_QPT_RC, 2, kMinRingBytes);
  RawQp flooded = pod.CreateQp(IBV_QPT_RC);
  RawQp control = pod.CreateQp(IBV_QPT_RC);
  for (RawQp* qp : {&trap, &flooded, &control}) qp->hdr()->credits.posted.store(16);
  SetTrap(trap);
  const auto peer = MeetPeer(rv, pod, {&trap, &flooded, &control});
  const std::vector<int> sent = PeerResults(rv, 3);
  const bool untouched = TrapUntouched(trap);
  r.Check(untouched,
          "a SEND from the other node into its QP whose ring indices it left misaligned 8 bytes "
          "before the end, a canary behind that ring",
          untouched ? "canary and indices untouched" : "the router wrote outside the ring");
  r.Check(sent[0] > IBV_WC_SUCCESS, "the same SEND, as its sender saw it (an error completion)",
          WcName(sent[0]));
  r.Check(sent[1] == IBV_WC_SUCCESS && sent[2] == IBV_WC_SUCCESS,
          "SENDs from the other node into its two other QPs",
          WcName(sent[1]) + ", " + WcName(sent[2]));
  if (peer) CorruptResponses(pod, flooded, control, *peer, r);
  return Conclude(r, rv);
}

}  // namespace ff::adversary
