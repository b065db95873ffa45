// One router, pods speaking the protocol over socketpairs: the pod sessions and the broker
// (HELLO, objects, QPs, same-node connects, MR tables, releases), and what a pod that
// breaks the protocol gets.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cerrno>

#include "harness.h"

namespace ff::router::test {
namespace {

class BrokerTest : public ::testing::Test {
 protected:
  TestRouter router{TestRouter::Options{}};
};

TEST_F(BrokerTest, HelloTellsThePodWhoItIsAndSharesAReadOnlyMrTable) {
  RawPod pod(router, Ip("10.0.2.3"));
  ASSERT_EQ(pod.Hello(), 0);
  EXPECT_EQ(ntohl(pod.hello().ip), Ip("10.0.2.3"));
  EXPECT_EQ(pod.hello().lid, 0x0203);  // its offset in the overlay 10.0.0.0/8
  EXPECT_EQ(pod.hello().prefix_len, 8u);
  EXPECT_STREQ(pod.hello().node, "node-a");
  Mapping ro;
  EXPECT_EQ(MapSegment(pod.mr_table_fd(), kMrTableBytes, false, &ro), 0);
  Mapping rw;
  EXPECT_EQ(MapSegment(pod.mr_table_fd(), kMrTableBytes, true, &rw), EACCES);
}

TEST_F(BrokerTest, AClientOutsideTheOverlayIsToldWhy) {
  RawPod pod(router, 0);  // the fake resolver refuses it
  EXPECT_EQ(pod.Hello(), EACCES);
  EXPECT_NE(std::string(pod.hello().node).find("overlay"), std::string::npos);
  EXPECT_TRUE(pod.Disconnected());
}

TEST_F(BrokerTest, AnotherAbiIsRefusedWithTheReason) {
  RawPod pod(router, Ip("10.0.0.5"));
  EXPECT_EQ(pod.Hello(kAbiVersion + 1), EPROTO);
  EXPECT_NE(std::string(pod.hello().node).find("ABI"), std::string::npos);
  EXPECT_EQ(pod.Hello(), 0);  // a matching library may still say HELLO
}

TEST_F(BrokerTest, ProtocolViolationsDisconnectOnlyTheSender) {
  RawPod good(router, Ip("10.0.0.1"));
  ASSERT_EQ(good.Hello(), 0);
  struct Case {
    const char* name;
    std::vector<char> bytes;
  };
  proto::CreateCq early{};
  early.h.op = proto::Op::kCreateCq;
  proto::DestroyQp big{};
  big.h.op = proto::Op::kDestroyQp;
  std::vector<char> oversized(sizeof(big) + 8, 0);
  std::memcpy(oversized.data(), &big, sizeof(big));
  const std::vector<Case> cases = {
      {"empty", {}},
      {"short header", {1, 0}},
      {"unknown op", std::vector<char>(64, 0x7f)},
      {"request before HELLO",
       std::vector<char>(reinterpret_cast<char*>(&early), reinterpret_cast<char*>(&early + 1))},
      {"wrong size after HELLO", oversized},
  };
  for (const Case& c : cases) {
    RawPod bad(router, Ip("10.0.0.2"));
    if (std::string(c.name) == "wrong size after HELLO") {
      ASSERT_EQ(bad.Hello(), 0);
    }
    bad.SendRaw(c.bytes.data(), c.bytes.size());
    EXPECT_TRUE(bad.Disconnected()) << c.name;
  }
  RawPod twice(router, Ip("10.0.0.3"));
  ASSERT_EQ(twice.Hello(), 0);
  proto::Hello again{};
  again.abi = kAbiVersion;
  twice.SendRaw(&again, sizeof(again));  // a second HELLO, without its descriptors
  EXPECT_TRUE(twice.Disconnected());
  EXPECT_EQ(good.CreateCq(7), 7u);  // the well-behaved pod is still served
  proto::DestroyCq d{};
  d.id = 7;
  EXPECT_EQ(good.Call(d).status, 0);
}

TEST_F(BrokerTest, CreateQpChecksWhatThePodHandsOver) {
  RawPod pod(router, Ip("10.0.0.1"));
  ASSERT_EQ(pod.Hello(), 0);
  const RawQp ok = pod.CreateQp(IBV_QPT_RC);
  ASSERT_NE(ok.qpn, 0u);
  const RawQp second = pod.CreateQp(IBV_QPT_RC);
  EXPECT_NE(second.qpn, ok.qpn);
  EXPECT_EQ(pod.CreateQp(IBV_QPT_RAW_PACKET).qpn, 0u);
  EXPECT_EQ(pod.CreateQp(IBV_QPT_RC, 1, 5000).qpn, 0u);  // not a power of two
  EXPECT_EQ(pod.CreateQp(IBV_QPT_RC, kMaxRingsPerQp + 1, 4096).qpn, 0u);
  // A segment smaller than the rings it claims.
  UniqueFd small;
  ASSERT_EQ(CreateSegment("small", 4096, &small), 0);
  proto::CreateQp m{};
  m.qp_type = IBV_QPT_RC;
  m.num_rings = 1;
  m.ring_bytes = kRcRingBytes;
  m.srq_id = proto::kNoId;
  m.recv_cq_id = 1;
  m.send_cq_id = 1;
  EXPECT_EQ(pod.Call(m, {small.get()}).status, EINVAL);
  m.recv_cq_id = 99;  // no such CQ
  EXPECT_EQ(pod.Call(m, {ok.seg_fd.get()}).status, EINVAL);
}

// The library posts DestroyQp (it cannot fail for its own QP): carried out in its turn,
// never answered, a refusal only logged. The next request's answer is its own.
TEST_F(BrokerTest, APostedDestroyQpIsCarriedOutAndNotAnswered) {
  RawPod pod(router, Ip("10.0.0.1"));
  ASSERT_EQ(pod.Hello(), 0);
  const RawQp qp = pod.CreateQp(IBV_QPT_RC);
  ASSERT_NE(qp.qpn, 0u);
  proto::DestroyQp d{};
  d.h.seq = proto::kPostedSeq;
  d.id = qp.qpn + 1000;  // no such QP: refused, and the refusal is not sent
  pod.SendRaw(&d, sizeof(d));
  d.id = qp.qpn;
  pod.SendRaw(&d, sizeof(d));
  proto::DestroyCq next{};
  next.h.seq = 7;
  next.id = 42;
  const proto::Response answer = pod.CallRaw(&next, sizeof(next), {}, nullptr);
  EXPECT_EQ(answer.h.seq, 7u);
  EXPECT_EQ(answer.status, ENOENT);
  proto::DestroyQp again{};
  again.id = qp.qpn;
  EXPECT_EQ(pod.Call(again).status, ENOENT) << "the posted DestroyQp came first";
}

// A pod may destroy only its own QPs, posted or not: naming another pod's QP number is
// refused (ENOENT, as for a QP that does not exist), and that QP lives on.
TEST_F(BrokerTest, APodCannotDestroyAnotherPodsQp) {
  RawPod victim(router, Ip("10.0.0.1"));
  RawPod attacker(router, Ip("10.0.0.2"));
  ASSERT_EQ(victim.Hello(), 0);
  ASSERT_EQ(attacker.Hello(), 0);
  const RawQp qp = victim.CreateQp(IBV_QPT_RC);
  ASSERT_NE(qp.qpn, 0u);
  proto::DestroyQp d{};
  d.id = qp.qpn;
  EXPECT_EQ(attacker.Call(d).status, ENOENT);
  d.h.seq = proto::kPostedSeq;
  attacker.SendRaw(&d, sizeof(d));
  EXPECT_EQ(attacker.CreateQp(IBV_QPT_RC).status, 0) << "the attacker is still served";
  proto::DestroyQp own{};
  own.id = qp.qpn;
  EXPECT_EQ(victim.Call(own).status, 0) << "the victim's QP was still there";
}

TEST_F(BrokerTest, ObjectsAreCountedPerPodAndNamedOnce) {
  RawPod pod(router, Ip("10.0.0.1"));
  ASSERT_EQ(pod.Hello(), 0);
  proto::CreateCq m{};
  m.cq_id = 3;
  m.notify_slot = proto::kNoId;
  m.chan_id = proto::kNoId;
  EXPECT_EQ(pod.Call(m).status, 0);
  EXPECT_EQ(pod.Call(m).status, EEXIST);
  m.cq_id = 4;
  m.notify_slot = proto::kWakeSlot;  // the wake word is not a CQ's
  m.chan_id = 1;
  EXPECT_EQ(pod.Call(m).status, EINVAL);
  proto::DestroyCq d{};
  d.id = 42;
  EXPECT_EQ(pod.Call(d).status, ENOENT);
}

TEST_F(BrokerTest, SameNodeConnectHandsOverOneRingOfThePeer) {
  RawPod a(router, Ip("10.0.0.1")), b(router, Ip("10.0.0.2")), c(router, Ip("10.0.0.3"));
  ASSERT_EQ(a.Hello(), 0);
  ASSERT_EQ(b.Hello(), 0);
  ASSERT_EQ(c.Hello(), 0);
  const RawQp qa = a.CreateQp(IBV_QPT_RC), qb = b.CreateQp(IBV_QPT_RC), qc = c.CreateQp(IBV_QPT_RC);
  EXPECT_EQ(a.Connect(qa, Ip("10.0.0.2"), qb.qpn).status, EINPROGRESS);  // B has not named A
  ASSERT_EQ(b.Name(qb, Ip("10.0.0.1"), qa.qpn), 0);  // A named B: B gets its ring at once
  RawLink link = a.Connect(qa, Ip("10.0.0.2"), qb.qpn);
  ASSERT_EQ(link.status, 0);
  EXPECT_EQ(link.reply.peer_qpn, qb.qpn);
  EXPECT_EQ(ntohl(link.reply.peer_ip), Ip("10.0.0.2"));
  EXPECT_EQ(link.fds.size(), static_cast<size_t>(proto::ConnectReplyFds(link.reply)));
  // What A writes into the ring it got is what B reads from its own segment.
  EXPECT_EQ(PassMessage(link, qb, "ping"), "ping");
  // B named A, not C: C never gets a ring of B's QP; A may connect again.
  EXPECT_EQ(c.Connect(qc, Ip("10.0.0.2"), qb.qpn).status, EINPROGRESS);
  EXPECT_EQ(a.Connect(qa, Ip("10.0.0.2"), qb.qpn).status, 0);
  // Wrong address for that QP, unknown QP, type mismatch.
  EXPECT_EQ(a.Connect(qa, Ip("10.0.0.3"), qb.qpn).status, EHOSTUNREACH);
  EXPECT_EQ(a.Connect(qa, Ip("10.0.0.2"), 0xabcdef).status, EHOSTUNREACH);
  const RawQp ud = b.CreateQp(IBV_QPT_UD, kUdRingsPerQp, kUdRingBytes);
  EXPECT_EQ(a.Connect(qa, Ip("10.0.0.2"), ud.qpn).status, EINVAL);
}

proto::NameQp NameOnly(const RawQp& qp, uint32_t peer_ip, uint32_t peer_qpn, bool posted) {
  proto::NameQp n{};
  n.h.seq = posted ? proto::kPostedSeq : 1;
  n.qpn = qp.qpn;
  n.dest_ip = htonl(peer_ip);
  n.dest_qpn = peer_qpn;
  return n;
}

// rdma_cm's passive side names its peer at RTR (NameQp) and does not ask for a link; the
// active side then connects. The passive QP is not told (kPeerNamed would only wake its
// process): it links when it first sends, and can.
TEST_F(BrokerTest, AQpThatNamedItsPeerWithoutAskingIsNotToldWhenThePeerConnects) {
  RawPod a(router, Ip("10.0.0.1")), b(router, Ip("10.0.0.2"));
  ASSERT_EQ(a.Hello(), 0);
  ASSERT_EQ(b.Hello(), 0);
  const RawQp qa = a.CreateQp(IBV_QPT_RC), qb = b.CreateQp(IBV_QPT_RC);
  const proto::NameQp posted = NameOnly(qa, Ip("10.0.0.2"), qb.qpn, true);
  a.SendRaw(&posted, sizeof(posted));
  ASSERT_TRUE(a.Flush());  // named before B connects
  RawLink from_b = b.Connect(qb, Ip("10.0.0.1"), qa.qpn);
  ASSERT_EQ(from_b.status, 0) << "A named B: B links at once";
  EXPECT_FALSE(a.NextSetupEvent(200).has_value()) << "A, which never asked, was told";
  RawLink from_a = a.Connect(qa, Ip("10.0.0.2"), qb.qpn);
  ASSERT_EQ(from_a.status, 0) << "A links when it needs to";
  EXPECT_EQ(PassMessage(from_a, qb, "late"), "late");
  EXPECT_EQ(PassMessage(from_b, qa, "early"), "early");
}

// NameQp (what the library posts at a passive side's RTR) names the peer and links nothing:
// a peer that named this QP first and asked is told it may link (kPeerNamed), and then it
// can; the posted request is never answered; refusals as for ConnectQp.
TEST_F(BrokerTest, ANameQpNamesThePeerWithoutALinkAndTellsAPeerThatAsked) {
  RawPod a(router, Ip("10.0.0.1")), b(router, Ip("10.0.0.2"));
  ASSERT_EQ(a.Hello(), 0);
  ASSERT_EQ(b.Hello(), 0);
  const RawQp qa = a.CreateQp(IBV_QPT_RC), qb = b.CreateQp(IBV_QPT_RC);
  EXPECT_EQ(a.Connect(qa, Ip("10.0.0.2"), qb.qpn).status, EINPROGRESS);  // B has not named A
  const proto::NameQp posted = NameOnly(qb, Ip("10.0.0.1"), qa.qpn, true);
  b.SendRaw(&posted, sizeof(posted));
  const auto e = a.NextSetupEvent();
  ASSERT_TRUE(e.has_value()) << "A, which asked, was not told";
  EXPECT_EQ(e->event.type, proto::EventType::kPeerNamed);
  EXPECT_EQ(e->event.qpn, qa.qpn);
  RawLink link = a.Connect(qa, Ip("10.0.0.2"), qb.qpn);
  ASSERT_EQ(link.status, 0);
  EXPECT_EQ(PassMessage(link, qb, "named"), "named");
  proto::DestroyCq next{};
  next.h.seq = 7;
  next.id = 42;
  const proto::Response answer = b.CallRaw(&next, sizeof(next), {}, nullptr);
  EXPECT_EQ(answer.h.seq, 7u) << "the posted NameQp was answered";
  EXPECT_EQ(answer.status, ENOENT);
  proto::NameQp sent = NameOnly(qb, Ip("10.0.0.1"), qa.qpn, false);
  EXPECT_EQ(b.CallRaw(&sent, sizeof(sent), {}, nullptr).status, 0) << "naming again";
  sent.dest_ip = 0;
  sent.dest_lid = 0xc001;  // a multicast LID: no pod
  EXPECT_EQ(b.CallRaw(&sent, sizeof(sent), {}, nullptr).status, EHOSTUNREACH);
  const RawQp ud = b.CreateQp(IBV_QPT_UD, kUdRingsPerQp, kUdRingBytes);
  sent = NameOnly(ud, Ip("10.0.0.1"), qa.qpn, false);
  EXPECT_EQ(b.CallRaw(&sent, sizeof(sent), {}, nullptr).status, EINVAL);
}

// Consent is the QP owner's to give: a pod that names a peer with another pod's QP number,
// answered or posted, is refused (ENOENT), and that QP's consent stays as its owner left it.
TEST_F(BrokerTest, APodCannotNameAPeerForAnotherPodsQp) {
  RawPod victim(router, Ip("10.0.0.1")), attacker(router, Ip("10.0.0.2"));
  ASSERT_EQ(victim.Hello(), 0);
  ASSERT_EQ(attacker.Hello(), 0);
  const RawQp qv = victim.CreateQp(IBV_QPT_RC), qa = attacker.CreateQp(IBV_QPT_RC);
  proto::NameQp forged = NameOnly(qv, Ip("10.0.0.2"), qa.qpn, false);
  EXPECT_EQ(attacker.CallRaw(&forged, sizeof(forged), {}, nullptr).status, ENOENT);
  forged.h.seq = proto::kPostedSeq;
  attacker.SendRaw(&forged, sizeof(forged));
  EXPECT_EQ(attacker.Connect(qa, Ip("10.0.0.1"), qv.qpn).status, EINPROGRESS)
      << "the victim's QP consented to the attacker";
  EXPECT_FALSE(victim.NextSetupEvent(200).has_value()) << "the victim heard of the forgery";
  // Its owner names the attacker's QP (which named it first: linked at once); then the
  // attacker may connect.
  ASSERT_EQ(victim.Name(qv, Ip("10.0.0.2"), qa.qpn), 0);
  EXPECT_EQ(attacker.Connect(qa, Ip("10.0.0.1"), qv.qpn).status, 0);
}

// A UD QP hears kUdRingsPerQp senders at once, as many as it has rings; a real one hears any
// number. A new sender takes the ring held longest, and the sender that had it hears that
// its link is lost (kUdPeerLost), so that it links again when it next sends. The target
// hears who sends into the ring now. A destroyed target tells every sender the same.
TEST_F(BrokerTest, ANewUdSenderTakesTheRingHeldLongestAndItsSenderHearsSo) {
  RawPod target(router, Ip("10.0.0.9"));
  ASSERT_EQ(target.Hello(), 0);
  const RawQp ud = target.CreateQp(IBV_QPT_UD, kUdRingsPerQp, kUdRingBytes);
  struct Sender {
    std::unique_ptr<RawPod> pod;
    RawQp qp;
    uint32_t ring = 0;
  };
  std::vector<Sender> senders;
  for (uint32_t i = 0; i < kUdRingsPerQp; ++i) {
    auto pod = std::make_unique<RawPod>(router, Ip("10.0.1.0") + i);
    ASSERT_EQ(pod->Hello(), 0);
    RawQp q = pod->CreateQp(IBV_QPT_UD, kUdRingsPerQp, kUdRingBytes);
    const RawLink link = pod->Connect(q, Ip("10.0.0.9"), ud.qpn, true);
    ASSERT_EQ(link.status, 0);
    senders.push_back({std::move(pod), std::move(q), link.reply.ring_index});
  }
  for (uint32_t i = 0; i < kUdRingsPerQp; ++i) ASSERT_TRUE(target.NextSetupEvent().has_value());
  const auto lost_by = [&](const Sender& s) {
    const auto e = s.pod->NextEvent(1000);
    return e.has_value() && e->type == proto::EventType::kUdPeerLost && e->qpn == s.qp.qpn &&
           e->src_ip == Ip("10.0.0.9") && e->src_qpn == ud.qpn;
  };

  RawPod late(router, Ip("10.0.2.1"));
  ASSERT_EQ(late.Hello(), 0);
  const RawQp q = late.CreateQp(IBV_QPT_UD, kUdRingsPerQp, kUdRingBytes);
  RawLink link = late.Connect(q, Ip("10.0.0.9"), ud.qpn, true);
  ASSERT_EQ(link.status, 0);
  EXPECT_EQ(link.reply.ring_index, senders[0].ring) << "not the ring held longest";
  EXPECT_TRUE(lost_by(senders[0])) << "the first sender was not told";
  auto e = target.NextSetupEvent();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->event.type, proto::EventType::kUdRing);
  EXPECT_EQ(e->event.ring, senders[0].ring);
  EXPECT_EQ(e->event.src_ip, Ip("10.0.2.1"));
  EXPECT_EQ(e->event.src_qpn, q.qpn);
  for (size_t i = 1; i < senders.size(); ++i)
    EXPECT_FALSE(senders[i].pod->NextEvent(0).has_value()) << "sender " << i << " heard something";

  // The first sender links again and takes the ring of the second.
  link = senders[0].pod->Connect(senders[0].qp, Ip("10.0.0.9"), ud.qpn, true);
  ASSERT_EQ(link.status, 0);
  EXPECT_EQ(link.reply.ring_index, senders[1].ring);
  EXPECT_TRUE(lost_by(senders[1]));
  EXPECT_EQ(router.Stat("ud_rings_taken"), 2u);

  proto::DestroyQp d{};
  d.id = ud.qpn;
  ASSERT_EQ(target.Call(d).status, 0);
  EXPECT_TRUE(lost_by(senders[0]));
  for (size_t i = 2; i < senders.size(); ++i) EXPECT_TRUE(lost_by(senders[i])) << i;
  const auto gone = late.NextEvent(1000);
  ASSERT_TRUE(gone.has_value());
  EXPECT_EQ(gone->type, proto::EventType::kUdPeerLost);
  EXPECT_EQ(late.Connect(q, Ip("10.0.0.9"), ud.qpn, true).status, EHOSTUNREACH);
}

// The attack the hand-over allows: a pod takes a UD destination's ring from another sender
// again and again (a one-ring QP makes every connect a hand-over). It costs the victim only
// a re-link: a ring handed over is a new memfd, so what the attacker keeps writing into the
// ring it lost is never read from the victim's ring, as the victim's, and the victim's
// message arrives once it linked again.
TEST_F(BrokerTest, ASenderThatLostItsUdRingCannotWriteIntoItsSuccessors) {
  RawPod target(router, Ip("10.0.0.9")), attacker(router, Ip("10.0.0.66")),
      victim(router, Ip("10.0.0.2"));
  ASSERT_EQ(target.Hello(), 0);
  ASSERT_EQ(attacker.Hello(), 0);
  ASSERT_EQ(victim.Hello(), 0);
  const RawQp ud = target.CreateQp(IBV_QPT_UD, 1, kUdRingBytes);
  const RawQp qa = attacker.CreateQp(IBV_QPT_UD, kUdRingsPerQp, kUdRingBytes);
  const RawQp qv = victim.CreateQp(IBV_QPT_UD, kUdRingsPerQp, kUdRingBytes);
  RawLink stale = attacker.Connect(qa, Ip("10.0.0.9"), ud.qpn, true);
  ASSERT_EQ(stale.status, 0);
  for (int round = 0; round < 3; ++round) {
    RawLink mine = victim.Connect(qv, Ip("10.0.0.9"), ud.qpn, true);
    ASSERT_EQ(mine.status, 0) << round;
    const auto lost = attacker.NextEvent(1000);
    ASSERT_TRUE(lost.has_value());
    EXPECT_EQ(lost->type, proto::EventType::kUdPeerLost);
    Mapping ring;
    RingConsumer in;
    proto::Event announced{};
    do {  // the attacker's own rings were announced too: skip to the victim's
      ASSERT_TRUE(NextUdRing(target, ud, &ring, &in, &announced));
    } while (announced.src_qpn != qv.qpn);
    // The attacker writes on into the ring it lost, then the victim sends.
    ASSERT_EQ(
        AppendRecord(stale.producer, RecordHeader{0, kRecSend, kRecFirst | kRecLast}, "forged", 6),
        RingStatus::kOk);
    stale.producer.Publish();
    ASSERT_EQ(
        AppendRecord(mine.producer, RecordHeader{0, kRecSend, kRecFirst | kRecLast}, "mine", 4),
        RingStatus::kOk);
    mine.producer.Publish();
    EXPECT_EQ(NextPayload(in), "mine") << round;
    EXPECT_EQ(NextPayload(in, std::chrono::milliseconds(50)), "") << "more in the victim's ring";
    // The attacker takes the ring back; the victim hears so and links again next round.
    stale = attacker.Connect(qa, Ip("10.0.0.9"), ud.qpn, true);
    ASSERT_EQ(stale.status, 0);
    const auto victim_lost = victim.NextEvent(1000);
    ASSERT_TRUE(victim_lost.has_value());
    EXPECT_EQ(victim_lost->type, proto::EventType::kUdPeerLost);
  }
}

TEST_F(BrokerTest, RegistrationsArePublishedAndRevokedInTheMrTable) {
  RawPod pod(router, Ip("10.0.0.1"));
  ASSERT_EQ(pod.Hello(), 0);
  Mapping memory;
  const uint32_t key =
      pod.Register(1, 8192, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE, 0x10000, &memory);
  ASSERT_NE(key, 0u);
  Mapping table;
  ASSERT_EQ(MapSegment(pod.mr_table_fd(), kMrTableBytes, false, &table), 0);
  MrView v;
  ASSERT_TRUE(ReadMrEntry(table.as<MrEntry>(), key, &v));
  EXPECT_EQ(v.addr, 0x10000u);
  EXPECT_EQ(v.length, 8192u);
  EXPECT_EQ(v.region, 1u);
  // A second registration in the same region; then both go away.
  proto::RegMr m{};
  m.addr = 0x11000;
  m.length = 4096;
  m.region_offset = 4096;
  m.access = IBV_ACCESS_LOCAL_WRITE;
  m.region_id = 1;
  EXPECT_EQ(pod.Call(m).status, EINVAL);  // no remote access: it may not have a region
  m.access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  const proto::Response r = pod.Call(m);
  ASSERT_EQ(r.status, 0);
  m.region_offset = 8192;  // past the region's end
  EXPECT_EQ(pod.Call(m).status, EINVAL);
  proto::DeregMr d{};
  d.key = key;
  EXPECT_EQ(pod.Call(d).status, 0);
  EXPECT_FALSE(ReadMrEntry(table.as<MrEntry>(), key, &v));
  EXPECT_EQ(pod.Call(d).status, EINVAL);  // twice
  d.key = r.u.reg_mr.key;
  d.release = 1;
  EXPECT_EQ(pod.Call(d).status, 0);
  // A region memfd smaller than the registration claims.
  UniqueFd tiny;
  ASSERT_EQ(CreateSegment("tiny", 4096, &tiny), 0);
  proto::RegMr big{};
  big.length = 8192;
  big.region_size = 8192;
  big.region_id = 2;
  big.new_region = 1;
  EXPECT_EQ(pod.Call(big, {tiny.get()}).status, EINVAL);
}

TEST_F(BrokerTest, PeersHearWhetherAQpWasDestroyedOrItsProcessDied) {
  RawPod a(router, Ip("10.0.0.1"));
  auto b = std::make_unique<RawPod>(router, Ip("10.0.0.2"));
  ASSERT_EQ(a.Hello(), 0);
  ASSERT_EQ(b->Hello(), 0);
  const RawQp qa = a.CreateQp(IBV_QPT_RC), qb1 = b->CreateQp(IBV_QPT_RC);
  const RawQp qb2 = b->CreateQp(IBV_QPT_RC);
  const RawQp qa2 = a.CreateQp(IBV_QPT_RC);
  ASSERT_EQ(b->Name(qb1, Ip("10.0.0.1"), qa.qpn), EINPROGRESS);
  ASSERT_EQ(b->Name(qb2, Ip("10.0.0.1"), qa2.qpn), EINPROGRESS);
  ASSERT_EQ(a.Connect(qa, Ip("10.0.0.2"), qb1.qpn).status, 0);
  ASSERT_EQ(a.Connect(qa2, Ip("10.0.0.2"), qb2.qpn).status, 0);
  proto::DestroyQp d{};
  d.id = qb1.qpn;
  ASSERT_EQ(b->Call(d).status, 0);
  auto e = a.NextEvent();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->type, proto::EventType::kPeerClosed);
  EXPECT_EQ(e->qpn, qa.qpn);
  b.reset();  // B's process exits with qb2 still connected
  e = a.NextEvent();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->type, proto::EventType::kPeerGone);
  EXPECT_EQ(e->qpn, qa2.qpn);
}

TEST_F(BrokerTest, RegionsGoOnlyToConnectedPeers) {
  RawPod a(router, Ip("10.0.0.1")), b(router, Ip("10.0.0.2"));
  ASSERT_EQ(a.Hello(), 0);
  ASSERT_EQ(b.Hello(), 0);
  Mapping memory;
  ASSERT_NE(b.Register(5, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ, 0x5000, &memory),
            0u);
  const RawQp qa = a.CreateQp(IBV_QPT_RC), qb = b.CreateQp(IBV_QPT_RC);
  proto::GetRegion g{};
  g.qpn = qa.qpn;
  g.region_id = 5;
  EXPECT_EQ(a.Call(g).status, ENOENT);  // not connected yet
  EXPECT_EQ(a.Connect(qa, Ip("10.0.0.2"), qb.qpn).status, EINPROGRESS);
  EXPECT_EQ(a.Call(g).status, ENOENT);  // B has not named A: no ring, no memory
  ASSERT_EQ(b.Name(qb, Ip("10.0.0.1"), qa.qpn), 0);
  ASSERT_EQ(a.Connect(qa, Ip("10.0.0.2"), qb.qpn).status, 0);
  std::vector<UniqueFd> fds;
  const proto::Response r = a.Call(g, {}, &fds);
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.u.region.size, 4096u);
  EXPECT_EQ(fds.size(), 1u);
  g.qpn = qb.qpn;  // a QP A does not own
  EXPECT_EQ(a.Call(g).status, ENOENT);
}

}  // namespace
}  // namespace ff::router::test
