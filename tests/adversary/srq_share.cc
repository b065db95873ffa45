// Issue 37, attack 5: a third pod broke RC traffic to a victim whose UD and RC QPs share an
// SRQ, for good. Resolving a UD destination needs no consent, and the router handed every UD
// sender the SRQ's segment writable: raising its claimed counter left the victim's RC peers
// without receive credits (RNR retries exceeded), also peers that came after the attacker
// had gone; and a datagram written without claiming took a receive an RC peer had been
// promised, whose SEND was then dropped while it completed.
//
// The attacker resolves the UD QP of the suite's SRQ victim (ffadversary_srq serve, which
// shares its SRQ with one RC QP per client) and does both with whatever it was handed: it
// must not have been given the SRQ; it spoils the credits it can reach (the UD QP's own) and
// writes datagrams without claiming. What must hold the suite checks: RC clients of the
// victim, one while the attack holds and two after it (one across nodes), complete every
// SEND, and the victim sees no failed completion.
#include "adversary.h"
#include "freeflow/codec.h"
#include "freeflow/ipv4.h"
#include "freeflow/tunables.h"

namespace ff::adversary {
namespace {

constexpr int kDatagrams = 256;  // written without a claim: more than the SRQ holds

}  // namespace

int SrqShare(const Args& a) {
  Report r("37.5", "srq-share");
  const Rendezvous rv(a.meet);
  const auto victim = FindVictim(a.dir, "srq-victim");
  RawPod pod = OpenPod();
  const int hello = pod.Hello(Abi());
  if (!victim || hello != 0) {
    r.Check(false, "setting up", victim ? "HELLO: " + ErrName(hello) : "no SRQ victim found");
    return Conclude(r, rv);
  }
  const RawQp mine = pod.CreateQp(IBV_QPT_UD, kUdRingsPerQp, kUdRingBytes);
  RawLink link = pod.Connect(mine, victim->ip, victim->ud_qpn, true);
  const std::string target =
      "the victim's UD QP " + FormatIpv4(victim->ip) + ":" + std::to_string(victim->ud_qpn);
  if (mine.qpn == 0 || link.status != 0 || link.seg.get() == nullptr) {
    r.Check(false, "resolving " + target + " (it shares an SRQ with RC QPs)",
            mine.qpn == 0 ? "no UD QP of its own" : "resolve: " + ErrName(link.status));
    return Conclude(r, rv);
  }
  r.Check(link.reply.has_srq == 0, "resolving " + target + ": being handed its SRQ",
          link.reply.has_srq == 0
              ? "not handed (" + std::to_string(link.fds.size()) + " descriptors)"
              : "handed the SRQ's segment");
  // Handed it (as a router before ABI 16 did, after the channel's wake socket): its claimed
  // count raised, so that no RC peer finds a credit.
  const size_t srq_fd = 3 + (link.reply.notify_slot != proto::kNoId ? 1 : 0);
  Mapping srq;
  if (link.reply.has_srq != 0 && srq_fd < link.fds.size() &&
      MapPeerSegment(link.fds[srq_fd].get(), sizeof(SrqSegment), true, &srq) == 0)
    srq.as<SrqSegment>()->credits.claimed.store(uint64_t{1} << 62);
  // The credits it can reach, the UD QP's own: spoiled, they cost its own datagrams only.
  link.seg.as<QpSegmentHeader>()->credits.claimed.store(uint64_t{1} << 62);
  int written = 0;
  for (; written < kDatagrams; ++written) {
    RecordHeader h{};
    h.kind = kRecSend;
    h.flags = kRecFirst | kRecLast;
    h.qkey = kVictimQkey;
    h.msg_len = 5;
    if (AppendRecord(link.producer, h, "evil", 5) != RingStatus::kOk) break;
  }
  link.producer.Publish();
  // The attack is in place once its datagrams are (its effect is the suite's to check, on
  // the victim's RC clients): none written is a set-up that failed.
  r.Check(written > 0,
          "raising the claimed count of the credits it was handed and writing " +
              std::to_string(kDatagrams) + " datagrams without a claim",
          std::to_string(written) + " written (the victim's RC clients are the suite's check)");
  return Conclude(r, rv);
}

}  // namespace ff::adversary
