// Per-pod quotas across two routers joined by the in-memory transport: requests waiting for
// another node, cross-node channels, READ data in flight, answers a pod does not take,
// requests queued for a target that does not keep up, what the router maps of a pod, and a
// long READ that must not pile up in the router. Each test drives one pod to the limit,
// checks what it gets, and checks that another pair of pods is fully served meanwhile,
// over the same link.
#include <gtest/gtest.h>
#include <infiniband/verbs.h>

#include <cerrno>
#include <cstring>
#include <numeric>

#include "freeflow/target_ops.h"
#include "harness.h"

namespace ff::router::test {
namespace {

constexpr uint32_t kAll = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                          IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
constexpr uint64_t kAddr = 0x100000;
constexpr uint32_t kMiB = 1u << 20;

// Node A (192.168.0.1) and node B (192.168.0.2), both with `limits`.
struct TwoNodes {
  explicit TwoNodes(PodLimits limits, uint32_t resolve_timeout_ms = 300,
                    size_t high_water = kLinkHighWater)
      : net(high_water),
        a(Node("node-a", "192.168.0.1", limits, resolve_timeout_ms)),
        b(Node("node-b", "192.168.0.2", limits, resolve_timeout_ms)) {}

  TestRouter::Options Node(const char* name, const char* ip, PodLimits limits,
                           uint32_t resolve_timeout_ms) {
    TestRouter::Options o;
    o.node = name;
    o.host_ip = Ip(ip);
    o.network = &net;
    o.cluster = &cluster;
    o.resolve_timeout_ms = resolve_timeout_ms;
    o.limits = limits;
    return o;
  }

  LoopbackNetwork net;
  FakeCluster cluster;
  TestRouter a, b;
};

// An initiator pod on node A and a target pod on node B with one RC QP each.
struct Pair {
  Pair(TwoNodes& n, const char* from_ip, const char* to_ip)
      : from(n.a, Ip(from_ip)), to(n.b, Ip(to_ip)), target_ip(Ip(to_ip)), from_ip_(Ip(from_ip)) {}

  // HELLO on both sides, `exposed` bytes of the target's memory registered at kAddr for
  // every access (filled with a pattern), the QPs (the target's open to every access) and
  // the initiator's connect: its status.
  int Open(uint32_t exposed = 0, uint32_t target_rings = 1, uint32_t ring_bytes = kRcRingBytes) {
    if (from.Hello() != 0 || to.Hello() != 0) return -1;
    if (exposed != 0) {
      rkey = to.Register(1, exposed, kAll, kAddr, &memory);
      if (rkey == 0) return -1;
      std::iota(memory.as<char>(), memory.as<char>() + exposed, 1);
    }
    qa = from.CreateQp(IBV_QPT_RC);
    qb = to.CreateQp(IBV_QPT_RC, target_rings, ring_bytes);
    if (qa.status != 0 || qb.status != 0) return -1;
    qb.hdr()->qp_access.store(kAll);
    const int named = to.Name(qb, from_ip_, qa.qpn);  // the target consents first
    if (named != EINPROGRESS) return named;
    link = from.Connect(qa, target_ip, qb.qpn);
    return link.status;
  }

  RawPod from, to;
  uint32_t target_ip;
  uint32_t from_ip_;
  RawQp qa, qb;
  RawLink link;
  Mapping memory;  // the target's exposed memory
  uint32_t rkey = 0;
};

// A whole work request in one record (rnr_retry 7: a SEND waits for a receive forever).
ProxyRequest Request(uint8_t opcode, uint32_t seq, uint32_t rkey, uint64_t addr, uint32_t len) {
  return ProxyRequest{.remote_addr = addr,
                      .compare_add = 0,
                      .swap = 0,
                      .rkey = rkey,
                      .seq = seq,
                      .length = len,
                      .opcode = opcode,
                      .last = 1,
                      .rnr_retry = 7,
                      .reserved = 0};
}

// `pod` hears that the peer of its QP `qpn` is gone.
void ExpectPeerGone(RawPod& pod, uint32_t qpn) {
  const std::optional<proto::Event> e = pod.NextEvent();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->type, proto::EventType::kPeerGone);
  EXPECT_EQ(e->qpn, qpn);
}

void PostRead(RawLink& link, uint32_t seq, uint32_t rkey, uint64_t addr, uint32_t len) {
  ASSERT_EQ(PostRequest(link, kRecReadReq, 0, Request(IBV_WR_RDMA_READ, seq, rkey, addr, len)),
            RingStatus::kOk);
}

// Takes the answers of READ `seq` up to its last into *out: 0, the error status, or -1 when
// an answer did not come or did not fit.
int ReadBack(RawLink& link, uint32_t seq, std::vector<char>* out) {
  for (;;) {
    std::vector<char> chunk;
    const std::optional<ProxyResponse> r = NextAnswer(link, &chunk);
    if (!r || r->seq != seq) return -1;
    if (r->status != IBV_WC_SUCCESS) return r->status;
    if (r->data_offset > out->size() || chunk.size() > out->size() - r->data_offset) return -1;
    std::memcpy(out->data() + r->data_offset, chunk.data(), chunk.size());
    if (r->last) return 0;
  }
}

// A fresh pair of pods passes a SEND and a 64 KiB READ between the two nodes: what every pod
// must still be able to do while another one is at a limit.
void ExpectCrossNodeServed(TwoNodes& n, const char* from_ip, const char* to_ip) {
  Pair p(n, from_ip, to_ip);
  ASSERT_EQ(p.Open(64 * 1024), 0);
  p.qb.hdr()->credits.posted.store(1);
  ASSERT_EQ(PostRequest(p.link, kRecSend, kRecFirst | kRecLast, Request(IBV_WR_SEND, 1, 0, 0, 4),
                        "ping", 4),
            RingStatus::kOk);
  const std::optional<ProxyResponse> sent = NextAnswer(p.link);
  ASSERT_TRUE(sent.has_value());
  EXPECT_EQ(sent->status, IBV_WC_SUCCESS);
  PostRead(p.link, 2, p.rkey, kAddr, 64 * 1024);
  std::vector<char> back(64 * 1024);
  ASSERT_EQ(ReadBack(p.link, 2, &back), 0);
  EXPECT_EQ(std::memcmp(back.data(), p.memory.get(), back.size()), 0);
}

TEST(CrossNodeQuotaTest, RequestsWaitingForAnotherNodeAreBounded) {
  TwoNodes n(WithLimits({{Quota::kPending, 2}}), 10000);
  RawPod pod(n.a, Ip("10.1.0.1"));
  ASSERT_EQ(pod.Hello(), 0);
  const RawQp q1 = pod.CreateQp(IBV_QPT_RC), q2 = pod.CreateQp(IBV_QPT_RC);
  const RawQp q3 = pod.CreateQp(IBV_QPT_RC);
  proto::ConnectQp m{};
  m.h.op = proto::Op::kConnectQp;
  m.dest_ip = htonl(Ip("10.9.9.9"));  // nobody knows it yet: the connects wait
  m.dest_qpn = 0x123;
  for (const RawQp* q : {&q1, &q2}) {
    m.qpn = q->qpn;
    m.h.seq = q->qpn;
    pod.SendRaw(&m, sizeof(m));  // without waiting for the answer
  }
  m.qpn = q3.qpn;
  m.h.seq = q3.qpn;
  const proto::Response third = pod.Call(m);
  EXPECT_EQ(third.h.seq, q3.qpn);
  EXPECT_EQ(third.status, EAGAIN);
  ExpectCrossNodeServed(n, "10.1.0.2", "10.2.0.2");
  // The address turns up (without such a QP): the waiting connects are answered, and the
  // pod may ask again.
  n.cluster.Set(Ip("10.9.9.9"), n.b.endpoint());
  for (int i = 0; i < 2; ++i) EXPECT_EQ(pod.Receive().status, EHOSTUNREACH);
  EXPECT_EQ(pod.Call(m).status, EHOSTUNREACH);
}

TEST(CrossNodeQuotaTest, CrossNodeChannelsAreBounded) {
  TwoNodes n(WithLimits({{Quota::kProxies, 2}}));
  RawPod from(n.a, Ip("10.1.0.1")), to(n.b, Ip("10.2.0.1"));
  ASSERT_EQ(from.Hello(), 0);
  ASSERT_EQ(to.Hello(), 0);
  std::vector<RawQp> mine, theirs;
  for (int i = 0; i < 3; ++i) {
    mine.push_back(from.CreateQp(IBV_QPT_RC));
    theirs.push_back(to.CreateQp(IBV_QPT_RC));
  }
  for (int i = 0; i < 3; ++i)
    ASSERT_EQ(to.Name(theirs[i], Ip("10.1.0.1"), mine[i].qpn), EINPROGRESS);
  EXPECT_EQ(from.Connect(mine[0], Ip("10.2.0.1"), theirs[0].qpn).status, 0);
  EXPECT_EQ(from.Connect(mine[1], Ip("10.2.0.1"), theirs[1].qpn).status, 0);
  EXPECT_EQ(from.Connect(mine[2], Ip("10.2.0.1"), theirs[2].qpn).status, ENOSPC);
  // A UD destination is a channel too.
  const RawQp ud = from.CreateQp(IBV_QPT_UD, kUdRingsPerQp, kUdRingBytes);
  const RawQp ud_to = to.CreateQp(IBV_QPT_UD, kUdRingsPerQp, kUdRingBytes);
  EXPECT_EQ(from.Connect(ud, Ip("10.2.0.1"), ud_to.qpn, true).status, ENOSPC);
  ExpectCrossNodeServed(n, "10.1.0.2", "10.2.0.2");
  proto::DestroyQp d{};
  d.id = mine[0].qpn;
  ASSERT_EQ(from.Call(d).status, 0);
  EXPECT_EQ(from.Connect(mine[2], Ip("10.2.0.1"), theirs[2].qpn).status, 0);
}

// A UD QP needs no link to each destination on a NIC: at the channel quota, a pod's new UD
// destination takes the channel of its oldest one (what was published on it still goes; its
// library hears kUdPeerLost and links again when it sends there next). RC channels are
// real connections and are never taken.
TEST(CrossNodeQuotaTest, AtTheChannelQuotaANewUdDestinationTakesTheOldestUdChannel) {
  TwoNodes n(WithLimits({{Quota::kProxies, 3}}));
  RawPod from(n.a, Ip("10.1.0.1")), to(n.b, Ip("10.2.0.1"));
  ASSERT_EQ(from.Hello(), 0);
  ASSERT_EQ(to.Hello(), 0);
  const RawQp rc = from.CreateQp(IBV_QPT_RC), rc_to = to.CreateQp(IBV_QPT_RC);
  ASSERT_EQ(to.Name(rc_to, Ip("10.1.0.1"), rc.qpn), EINPROGRESS);
  ASSERT_EQ(from.Connect(rc, Ip("10.2.0.1"), rc_to.qpn).status, 0);
  const RawQp ud = from.CreateQp(IBV_QPT_UD, kUdRingsPerQp, kUdRingBytes);
  std::vector<RawQp> dests;
  for (int i = 0; i < 3; ++i) {
    dests.push_back(to.CreateQp(IBV_QPT_UD, kUdRingsPerQp, kUdRingBytes));
    dests.back().hdr()->credits.posted.store(1);
  }
  RawLink first = from.Connect(ud, Ip("10.2.0.1"), dests[0].qpn, true);
  ASSERT_EQ(first.status, 0);
  Mapping ring;
  RingConsumer in;
  proto::Event announced{};
  ASSERT_TRUE(NextUdRing(to, dests[0], &ring, &in, &announced));
  ASSERT_EQ(PostSend(first, 1, "oldest"), RingStatus::kOk);
  ASSERT_EQ(from.Connect(ud, Ip("10.2.0.1"), dests[1].qpn, true).status, 0);
  EXPECT_EQ(from.Connect(ud, Ip("10.2.0.1"), dests[2].qpn, true).status, 0);
  const auto lost = from.NextEvent();
  ASSERT_TRUE(lost.has_value());
  EXPECT_EQ(lost->type, proto::EventType::kUdPeerLost);
  EXPECT_EQ(lost->qpn, ud.qpn);
  EXPECT_EQ(lost->src_qpn, dests[0].qpn);
  EXPECT_EQ(NextPayload(in), "oldest");
  EXPECT_EQ(n.a.Stat("ud_links_recycled"), 1u);
  // The RC channel stays: an RC connect at the quota is refused, with no UD channel to take.
  const RawQp rc2 = from.CreateQp(IBV_QPT_RC), rc2_to = to.CreateQp(IBV_QPT_RC);
  ASSERT_EQ(to.Name(rc2_to, Ip("10.1.0.1"), rc2.qpn), EINPROGRESS);
  EXPECT_EQ(from.Connect(rc2, Ip("10.2.0.1"), rc2_to.qpn).status, ENOSPC);
  EXPECT_FALSE(from.NextEvent(200).has_value()) << "the RC channel was taken";
}

TEST(CrossNodeQuotaTest, ReadsWaitInTheRingForThePodsReadBudget) {
  TwoNodes n(WithLimits({{Quota::kReadBytes, 1}}));
  Pair p(n, "10.1.0.1", "10.2.0.1");
  ASSERT_EQ(p.Open(3 * kMiB), 0);
  for (uint32_t seq = 0; seq < 3; ++seq) PostRead(p.link, seq, p.rkey, kAddr + seq * kMiB, kMiB);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  // The first READ left; the second waits in the request ring until the first's answers
  // reached the response ring (this pod takes none yet).
  RingConsumer left;
  left.Attach(QpRing(p.link.seg.get(), kProxyRequestRing, p.link.reply.ring_bytes),
              p.link.reply.ring_bytes);
  RecordHeader h;
  const char* payload = nullptr;
  ASSERT_EQ(left.Peek(&h, &payload), RingStatus::kOk);
  ProxyRequest waiting;
  std::memcpy(&waiting, payload, sizeof(waiting));
  EXPECT_EQ(waiting.seq, 1u);
  ExpectCrossNodeServed(n, "10.1.0.2", "10.2.0.2");  // another pod has a budget of its own
  for (uint32_t seq = 0; seq < 3; ++seq) {
    std::vector<char> back(kMiB);
    ASSERT_EQ(ReadBack(p.link, seq, &back), 0) << seq;
    EXPECT_EQ(std::memcmp(back.data(), p.memory.as<char>() + seq * kMiB, kMiB), 0) << seq;
  }
}

TEST(CrossNodeQuotaTest, APodThatTakesNoAnswersLosesItsQpNotTheRoutersMemory) {
  TwoNodes n(WithLimits({{Quota::kQueuedBytes, 1}}));
  Pair p(n, "10.1.0.1", "10.2.0.1");
  ASSERT_EQ(p.Open(4 * kMiB), 0);
  PostRead(p.link, 1, p.rkey, kAddr, 4 * kMiB);  // 4 MiB of answers for a 512 KiB ring
  ExpectPeerGone(p.from, p.qa.qpn);
  ExpectCrossNodeServed(n, "10.1.0.2", "10.2.0.2");
}

TEST(CrossNodeQuotaTest, ATargetThatDoesNotKeepUpLosesItsConnectionNotTheLink) {
  TwoNodes n(WithLimits({{Quota::kQueuedBytes, 1}}));
  Pair p(n, "10.1.0.1", "10.2.0.1");
  ASSERT_EQ(p.Open(), 0);  // the target posts no receive: every SEND waits on node B
  const std::vector<char> chunk(kMaxFragment, 's');
  RecordHeader h;
  const char* answer = nullptr;
  const auto answered = [&] { return p.link.responses.Peek(&h, &answer) == RingStatus::kOk; };
  for (uint32_t seq = 0; seq < 64 && !answered();) {
    const ProxyRequest r = Request(IBV_WR_SEND, seq, 0, 0, kMaxFragment);
    if (TryPostRequest(p.link, kRecSend, kRecFirst | kRecLast, r, chunk.data(), kMaxFragment,
                       std::chrono::milliseconds(10)))
      ++seq;
  }
  const std::optional<ProxyResponse> r = NextAnswer(p.link);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, IBV_WC_RNR_RETRY_EXC_ERR);
  ExpectPeerGone(p.from, p.qa.qpn);
  ExpectPeerGone(p.to, p.qb.qpn);
  ExpectCrossNodeServed(n, "10.1.0.2", "10.2.0.2");
}

TEST(CrossNodeQuotaTest, WhatTheRouterMapsOfAPodIsBounded) {
  TwoNodes n(WithLimits({{Quota::kMappedBytes, 1}}));
  {
    // A target QP whose segment alone is larger than the quota cannot be reached from afar.
    Pair big(n, "10.1.0.1", "10.2.0.1");
    EXPECT_EQ(big.Open(0, 4, kMiB), ENOMEM);
  }
  Pair p(n, "10.1.0.3", "10.2.0.3");
  ASSERT_EQ(p.Open(), 0);  // its segment: a little over 512 KiB
  Mapping small, large;
  const uint32_t small_key = p.to.Register(1, 256 * 1024, kAll, kAddr, &small);
  const uint32_t large_key = p.to.Register(2, kMiB, kAll, kAddr + 4 * kMiB, &large);
  ASSERT_NE(small_key, 0u);
  ASSERT_NE(large_key, 0u);
  ASSERT_EQ(PostRequest(p.link, kRecWrite, 0, Request(IBV_WR_RDMA_WRITE, 1, small_key, kAddr, 4),
                        "fits", 4),
            RingStatus::kOk);
  std::optional<ProxyResponse> r = NextAnswer(p.link);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, IBV_WC_SUCCESS);
  EXPECT_EQ(std::string(small.as<char>(), 4), "fits");
  ASSERT_EQ(PostRequest(p.link, kRecWrite, 0,
                        Request(IBV_WR_RDMA_WRITE, 2, large_key, kAddr + 4 * kMiB, 4), "over", 4),
            RingStatus::kOk);
  r = NextAnswer(p.link);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(std::string(large.as<char>(), 4), std::string(4, '\0'));
  ExpectCrossNodeServed(n, "10.1.0.2", "10.2.0.2");
}

TEST(CrossNodeQuotaTest, ALongReadIsAnsweredAsTheLinkDrainsNotAllAtOnce) {
  TwoNodes n(DefaultPodLimits(), 300, 64 * 1024);  // a link congested at 64 KiB
  Pair p(n, "10.1.0.1", "10.2.0.1");
  ASSERT_EQ(p.Open(2 * kMiB), 0);
  n.net.Pause("node-a", true);  // node A takes nothing: node B's answers pile up
  const uint64_t before = n.net.messages_sent();
  PostRead(p.link, 1, p.rkey, kAddr, 2 * kMiB);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const uint64_t sent = n.net.messages_sent() - before;
  EXPECT_LT(sent, 10u) << "node B queued the whole 2 MiB READ at once";
  n.net.Pause("node-a", false);
  std::vector<char> back(2 * kMiB);
  ASSERT_EQ(ReadBack(p.link, 1, &back), 0);
  EXPECT_EQ(std::memcmp(back.data(), p.memory.get(), back.size()), 0);
}

}  // namespace
}  // namespace ff::router::test
