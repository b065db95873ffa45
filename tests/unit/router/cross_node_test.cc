// Two routers joined by the in-memory node transport, pods speaking the protocol themselves:
// forwarding (proxy segments, doorbells, answers) and target execution (credits and RNR,
// records in the target's ring, WRITE/READ/ATOMIC against its memory), in order, with
// back-pressure, and what each side hears when a peer, a process or a link goes away.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <sys/eventfd.h>

#include <cerrno>
#include <cstring>
#include <numeric>
#include <thread>

#include "cross_node_fixture.h"
#include "freeflow/target_ops.h"

namespace ff::router::test {
namespace {

TEST_F(CrossNodeTest, SendsArriveInOrderFromTheInitiatorAndAreAcknowledged) {
  qb.hdr()->credits.posted.store(50);
  for (uint32_t i = 0; i < 50; ++i) Send(i, "message " + std::to_string(i));
  for (uint32_t i = 0; i < 50; ++i) {
    RecordHeader h;
    std::vector<char> payload;
    ASSERT_TRUE(NextRecord(inbound, &h, &payload));
    EXPECT_EQ(std::string(payload.begin(), payload.end()), "message " + std::to_string(i));
    EXPECT_EQ(h.src_qpn, qa.qpn);
    EXPECT_EQ(ntohl(h.src_ip), Ip("10.1.0.1"));
    const ProxyResponse r = Answer();
    EXPECT_EQ(r.seq, i);
    EXPECT_EQ(r.status, IBV_WC_SUCCESS);
  }
}

// The target tells its QP that the initiator named it (kPeerNamed) only when that QP asked
// for a link first: the fixture's target did (answered EINPROGRESS). One that only named
// its initiator (NameQp, what an rdma_cm passive side posts) is not woken for it: it links
// when it first sends, and can.
TEST_F(CrossNodeTest, ATargetQpIsToldItWasNamedOnlyWhenItAsked) {
  auto told = target.NextSetupEvent();
  ASSERT_TRUE(told.has_value()) << "the fixture's target asked and was not told";
  EXPECT_EQ(told->event.type, proto::EventType::kPeerNamed);
  EXPECT_EQ(told->event.qpn, qb.qpn);
  const RawQp qc = target.CreateQp(IBV_QPT_RC), qd = initiator.CreateQp(IBV_QPT_RC);
  proto::NameQp n{};
  n.h.seq = proto::kPostedSeq;
  n.qpn = qc.qpn;
  n.dest_ip = htonl(Ip("10.1.0.1"));
  n.dest_qpn = qd.qpn;
  target.SendRaw(&n, sizeof(n));
  ASSERT_TRUE(target.Flush());  // named before the initiator connects
  ASSERT_EQ(initiator.Connect(qd, Ip("10.2.0.1"), qc.qpn).status, 0);
  EXPECT_FALSE(target.NextSetupEvent(300).has_value()) << "a QP that never asked was told";
  const RawLink back = target.Connect(qc, Ip("10.1.0.1"), qd.qpn);
  EXPECT_EQ(back.status, 0) << "it links when it needs to";
}

TEST_F(CrossNodeTest, AFragmentedMessageKeepsItsFragmentsTogether) {
  qb.hdr()->credits.posted.store(1);
  std::vector<char> big(3 * kMaxFragment + 100);
  std::iota(big.begin(), big.end(), 0);
  ProxyRequest r{};
  r.opcode = IBV_WR_SEND;
  r.length = static_cast<uint32_t>(big.size());
  r.rnr_retry = 7;
  for (uint32_t off = 0; off < big.size(); off += kMaxFragment) {
    const uint32_t frag = std::min<uint32_t>(kMaxFragment, r.length - off);
    r.last = off + frag == r.length;
    Post(kRecSend, (off == 0 ? kRecFirst : 0) | (r.last ? kRecLast : 0), r, big.data() + off, frag);
  }
  std::vector<char> got;
  for (;;) {
    RecordHeader h;
    std::vector<char> payload;
    ASSERT_TRUE(NextRecord(inbound, &h, &payload));
    got.insert(got.end(), payload.begin(), payload.end());
    if (h.flags & kRecLast) break;
  }
  EXPECT_EQ(got, big);
  EXPECT_EQ(Answer().status, IBV_WC_SUCCESS);
}

TEST_F(CrossNodeTest, RnrRetriesRunOutThenNothingMoreIsExecuted) {
  qb.hdr()->min_rnr_timer.store(1);  // 10 us between retries
  Send(1, "nobody listens", 2);
  const ProxyResponse r = Answer();
  EXPECT_EQ(r.seq, 1u);
  EXPECT_EQ(r.status, IBV_WC_RNR_RETRY_EXC_ERR);
  qb.hdr()->credits.posted.store(5);
  // What the initiator sent behind the error is not executed; it is answered flushed (the
  // initiator's QP failed and ignores it; a direct initiator counts answers owed).
  Send(2, "after the error");
  const ProxyResponse after = Answer();
  EXPECT_EQ(after.seq, 2u);
  EXPECT_EQ(after.status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_TRUE(NoAnswer(200));
  RecordHeader h;
  const char* p;
  EXPECT_EQ(inbound.Peek(&h, &p), RingStatus::kEmpty);
}

TEST_F(CrossNodeTest, ASendWaitsForAReceivePostedInTime) {
  qb.hdr()->min_rnr_timer.store(14);  // 1.28 ms between retries
  Send(1, "wait for me", 7);
  EXPECT_TRUE(NoAnswer(30));
  qb.hdr()->credits.posted.store(1);
  EXPECT_EQ(Answer().status, IBV_WC_SUCCESS);
  RecordHeader h;
  std::vector<char> payload;
  ASSERT_TRUE(NextRecord(inbound, &h, &payload));
}

TEST_F(CrossNodeTest, WriteReadAndAtomicsReachTheTargetsMemoryWithoutIt) {
  Mapping memory;
  const uint32_t rkey = target.Register(1, 1 << 20, kAll, kAddr, &memory);
  ASSERT_NE(rkey, 0u);
  std::vector<char> data(kMaxFragment + 5000);
  std::iota(data.begin(), data.end(), 7);
  ProxyRequest w{};
  w.opcode = IBV_WR_RDMA_WRITE;
  w.rkey = rkey;
  w.seq = 1;
  w.length = static_cast<uint32_t>(data.size());
  w.remote_addr = kAddr + 64;
  Post(kRecWrite, 0, w, data.data(), kMaxFragment);
  w.remote_addr += kMaxFragment;
  w.last = 1;
  Post(kRecWrite, 0, w, data.data() + kMaxFragment,
       static_cast<uint32_t>(data.size()) - kMaxFragment);
  EXPECT_EQ(Answer().status, IBV_WC_SUCCESS);
  EXPECT_EQ(std::memcmp(memory.as<char>() + 64, data.data(), data.size()), 0);

  ProxyRequest rd{};
  rd.opcode = IBV_WR_RDMA_READ;
  rd.rkey = rkey;
  rd.seq = 2;
  rd.length = static_cast<uint32_t>(data.size());
  rd.remote_addr = kAddr + 64;
  rd.last = 1;
  Post(kRecReadReq, 0, rd);
  std::vector<char> back(data.size());
  for (bool last = false; !last;) {
    std::vector<char> chunk;
    const ProxyResponse r = Answer(&chunk);
    ASSERT_EQ(r.status, IBV_WC_SUCCESS);
    ASSERT_LE(r.data_offset + chunk.size(), back.size());
    std::memcpy(back.data() + r.data_offset, chunk.data(), chunk.size());
    last = r.last;
  }
  EXPECT_EQ(back, data);

  uint64_t* word = reinterpret_cast<uint64_t*>(memory.as<char>() + 8);
  *word = 40;
  ProxyRequest fa{};
  fa.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
  fa.rkey = rkey;
  fa.seq = 3;
  fa.length = 8;
  fa.remote_addr = kAddr + 8;
  fa.compare_add = 2;
  fa.last = 1;
  Post(kRecAtomicReq, 0, fa);
  std::vector<char> old;
  EXPECT_EQ(Answer(&old).status, IBV_WC_SUCCESS);
  ASSERT_EQ(old.size(), 8u);
  EXPECT_EQ(*reinterpret_cast<uint64_t*>(old.data()), 40u);
  ProxyRequest cs = fa;
  cs.opcode = IBV_WR_ATOMIC_CMP_AND_SWP;
  cs.seq = 4;
  cs.compare_add = 42;
  cs.swap = 7;
  Post(kRecAtomicReq, 0, cs);
  EXPECT_EQ(Answer(&old).status, IBV_WC_SUCCESS);
  EXPECT_EQ(*reinterpret_cast<uint64_t*>(old.data()), 42u);
  EXPECT_EQ(*word, 7u);
}

// Each violation completes its request with an error, and the channel executes nothing after
// it (RC semantics), so each case gets a fresh QP pair.
// A WRITE leaves nothing in the target's ring, so it wakes nobody: a target process asleep
// in poll_cq (its wake word armed) was woken for every batch of WRITEs, which took the CPU
// its router needed. A SEND, which the target's program must take, still wakes it.
TEST_F(CrossNodeTest, AWriteWakesNoProcessASendDoes) {
  Mapping memory;
  const uint32_t rkey = target.Register(1, 1 << 16, kAll, kAddr, &memory);
  ASSERT_NE(rkey, 0u);
  NotifySlot* wake = target.Slot(proto::kWakeSlot);
  wake->armed.store(1);
  const std::string text = "written, not sent";
  ProxyRequest w{};
  w.opcode = IBV_WR_RDMA_WRITE;
  w.rkey = rkey;
  w.seq = 1;
  w.length = static_cast<uint32_t>(text.size());
  w.remote_addr = kAddr;
  w.last = 1;
  Post(kRecWrite, 0, w, text.data(), w.length);
  EXPECT_EQ(Answer().status, IBV_WC_SUCCESS);
  EXPECT_EQ(std::memcmp(memory.as<char>(), text.data(), text.size()), 0);
  pollfd p{target.wake_fd(), POLLIN, 0};
  EXPECT_EQ(::poll(&p, 1, 100), 0) << "the WRITE woke the target's process";
  EXPECT_EQ(wake->armed.load(), 1u);
  qb.hdr()->credits.posted.store(1);
  Send(2, "sent");
  RecordHeader h;
  std::vector<char> payload;
  ASSERT_TRUE(NextRecord(inbound, &h, &payload));
  EXPECT_EQ(Answer().status, IBV_WC_SUCCESS);
  EXPECT_EQ(::poll(&p, 1, 3000), 1) << "the SEND did not wake the target's process";
  EXPECT_EQ(wake->armed.load(), 0u);
}

TEST_F(CrossNodeTest, AccessViolationsAreAnsweredAsARealTargetWould) {
  Mapping memory;
  const uint32_t rkey =
      target.Register(1, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ, kAddr, &memory);
  ASSERT_NE(rkey, 0u);
  struct Case {
    const char* what;
    uint8_t kind;
    uint8_t opcode;
    uint32_t rkey;
    uint64_t addr;
    uint32_t len;
    uint16_t status;
  };
  const Case cases[] = {
      {"forged rkey", kRecReadReq, IBV_WR_RDMA_READ, rkey + 1, kAddr, 8, IBV_WC_REM_ACCESS_ERR},
      {"past the end", kRecReadReq, IBV_WR_RDMA_READ, rkey, kAddr + 4000, 200,
       IBV_WC_REM_ACCESS_ERR},
      {"write without access", kRecWrite, IBV_WR_RDMA_WRITE, rkey, kAddr, 8, IBV_WC_REM_ACCESS_ERR},
      {"misaligned atomic", kRecAtomicReq, IBV_WR_ATOMIC_FETCH_AND_ADD, rkey, kAddr + 3, 8,
       IBV_WC_REM_INV_REQ_ERR},
      {"atomic without access", kRecAtomicReq, IBV_WR_ATOMIC_FETCH_AND_ADD, rkey, kAddr, 8,
       IBV_WC_REM_ACCESS_ERR},
  };
  for (const Case& c : cases) {
    const RawQp from = initiator.CreateQp(IBV_QPT_RC);
    const RawQp to = target.CreateQp(IBV_QPT_RC);
    to.hdr()->qp_access.store(kAll);
    ASSERT_EQ(target.Name(to, Ip("10.1.0.1"), from.qpn), EINPROGRESS);
    link = initiator.Connect(from, Ip("10.2.0.1"), to.qpn);
    ASSERT_EQ(link.status, 0) << c.what;
    ProxyRequest r{};
    r.opcode = c.opcode;
    r.rkey = c.rkey;
    r.remote_addr = c.addr;
    r.length = c.len;
    r.last = 1;
    const std::vector<char> bytes(c.kind == kRecWrite ? c.len : 0, 'x');
    Post(c.kind, 0, r, bytes.data(), static_cast<uint32_t>(bytes.size()));
    EXPECT_EQ(Answer().status, c.status) << c.what;
  }
  EXPECT_EQ(std::string(memory.as<char>(), 8), std::string(8, '\0'));
}

TEST_F(CrossNodeTest, ATargetQpThatDisallowsRemoteWritesRefusesThem) {
  Mapping memory;
  const uint32_t rkey = target.Register(1, 4096, kAll, kAddr, &memory);
  qb.hdr()->qp_access.store(IBV_ACCESS_REMOTE_READ);
  ProxyRequest w{};
  w.opcode = IBV_WR_RDMA_WRITE;
  w.rkey = rkey;
  w.remote_addr = kAddr;
  w.length = 4;
  w.last = 1;
  Post(kRecWrite, 0, w, "abcd", 4);
  EXPECT_EQ(Answer().status, IBV_WC_REM_ACCESS_ERR);
}

TEST_F(CrossNodeTest, TheTargetsProcessExitingFailsTheInitiatorsQp) {
  RawPod other(b, Ip("10.2.0.2"));
  ASSERT_EQ(other.Hello(), 0);
  const RawQp q = other.CreateQp(IBV_QPT_RC);
  const RawQp from = initiator.CreateQp(IBV_QPT_RC);
  ASSERT_EQ(other.Name(q, Ip("10.1.0.1"), from.qpn), EINPROGRESS);
  ASSERT_EQ(initiator.Connect(from, Ip("10.2.0.2"), q.qpn).status, 0);
  { RawPod gone = std::move(other); }  // its process exits
  std::optional<proto::Event> e;
  ASSERT_TRUE(WaitFor([&] { return (e = initiator.NextEvent(50)).has_value(); }));
  EXPECT_EQ(e->type, proto::EventType::kPeerGone);
  EXPECT_EQ(e->qpn, from.qpn);
}

TEST_F(CrossNodeTest, DestroyingTheInitiatorsQpClosesTheTargetsConnection) {
  proto::DestroyQp d{};
  d.id = qa.qpn;
  ASSERT_EQ(initiator.Call(d).status, 0);
  const auto e = target.NextEvent();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->type, proto::EventType::kPeerClosed);
  EXPECT_EQ(e->qpn, qb.qpn);
}

// What the initiator published and the router had not forwarded when its QP went away
// still reaches the target before the close (a UD send is complete once posted: udaddy's
// server exited right after its replies and the client lost them).
TEST_F(CrossNodeTest, WhatWasPublishedBeforeTheQpWentAwayStillArrives) {
  qb.hdr()->credits.posted.store(1);
  ProxyRequest r{};
  r.opcode = IBV_WR_SEND;
  r.length = 4;
  r.last = 1;
  r.rnr_retry = 7;
  RecordHeader h{};
  h.kind = kRecSend;
  h.flags = kRecFirst | kRecLast;
  h.msg_len = r.length;
  ASSERT_EQ(AppendRequest(link.producer, h, r, 4, [](char* d) { std::memcpy(d, "last", 4); }),
            RingStatus::kOk);
  link.producer.Publish();  // no doorbell: only the router's next tick, or the close, takes it
  proto::DestroyQp d{};
  d.id = qa.qpn;
  ASSERT_EQ(initiator.Call(d).status, 0);
  RecordHeader got;
  std::vector<char> payload;
  ASSERT_TRUE(NextRecord(inbound, &got, &payload));
  EXPECT_EQ(std::string(payload.begin(), payload.end()), "last");
}

TEST_F(CrossNodeTest, AnInitiatorThatLeavesDuringItsConnectFreesTheTargetsRing) {
  const RawQp to = target.CreateQp(IBV_QPT_RC);  // an RC QP has exactly one ring
  {
    RawPod leaver(a, Ip("10.1.0.9"));
    ASSERT_EQ(leaver.Hello(), 0);
    const RawQp from = leaver.CreateQp(IBV_QPT_RC);
    ASSERT_EQ(target.Name(to, Ip("10.1.0.9"), from.qpn), EINPROGRESS);
    proto::ConnectQp m{};
    m.qpn = from.qpn;
    m.dest_ip = htonl(Ip("10.2.0.1"));
    m.dest_qpn = to.qpn;
    leaver.SendRaw(&m, sizeof(m));  // and its process exits before the answer
  }
  const RawQp from = initiator.CreateQp(IBV_QPT_RC);
  // The target forgets the leaver (RESET) and names the initiator instead.
  proto::DisconnectQp reset{};
  reset.id = to.qpn;
  ASSERT_EQ(target.Call(reset).status, 0);
  ASSERT_EQ(target.Name(to, Ip("10.1.0.1"), from.qpn), EINPROGRESS);
  EXPECT_TRUE(WaitFor([&] { return initiator.Connect(from, Ip("10.2.0.1"), to.qpn).status == 0; }))
      << "the target's only ring stayed taken by a channel nobody uses";
}

// A pod that writes a request no library writes (a SEND record whose opcode is a READ) into
// its proxy ring: its own QP fails, nothing reaches the other node, other QPs go on.
TEST_F(CrossNodeTest, APodThatForgesItsProxyRingFailsOnlyItsOwnQp) {
  ProxyRequest forged{};
  forged.opcode = IBV_WR_RDMA_READ;
  forged.length = 4;
  forged.last = 1;
  Post(kRecSend, kRecFirst | kRecLast, forged, "evil", 4);
  const auto e = initiator.NextEvent();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->type, proto::EventType::kPeerGone);
  EXPECT_EQ(e->qpn, qa.qpn);
  RecordHeader h;
  const char* p;
  EXPECT_EQ(inbound.Peek(&h, &p), RingStatus::kEmpty);
  const RawQp from = initiator.CreateQp(IBV_QPT_RC);
  const RawQp to = target.CreateQp(IBV_QPT_RC);
  to.hdr()->credits.posted.store(1);
  ASSERT_EQ(target.Name(to, Ip("10.1.0.1"), from.qpn), EINPROGRESS);
  link = initiator.Connect(from, Ip("10.2.0.1"), to.qpn);
  ASSERT_EQ(link.status, 0);
  Send(1, "still served");
  EXPECT_EQ(Answer().status, IBV_WC_SUCCESS);
}

// A pod closes the completion channel of a CQ that remote senders still wake. The router
// must not send on the descriptor number it had for it: the next descriptor the process
// opens gets that number (here: one of the test's own wake sockets).
TEST_F(CrossNodeTest, AChannelClosedUnderACrossNodeSenderIsNeverWrittenAgain) {
  UniqueFd chan_rx, chan;
  ASSERT_EQ(CreateWakePair(&chan_rx, &chan, true), 0);
  proto::CreateChannel c{};
  c.id = 1;
  UniqueFd efd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  EXPECT_EQ(target.Call(c, {efd.get()}).status, EINVAL);  // an eventfd is never woken
  ASSERT_EQ(target.Call(c, {chan.get()}).status, 0);
  ASSERT_EQ(target.CreateCq(2, 5, 1), 2u);
  const RawQp to = target.CreateQp(IBV_QPT_RC, 1, kRcRingBytes, 2);
  to.hdr()->credits.posted.store(1);
  const RawQp from = initiator.CreateQp(IBV_QPT_RC);
  ASSERT_EQ(target.Name(to, Ip("10.1.0.1"), from.qpn), EINPROGRESS);
  link = initiator.Connect(from, Ip("10.2.0.1"), to.qpn);
  ASSERT_EQ(link.status, 0);  // the router now has a sender that wakes CQ 2
  proto::DestroyChannel d{};
  d.id = 1;
  ASSERT_EQ(target.Call(d).status, 0);  // the router closed its copy of the socket
  std::vector<UniqueFd> reused;         // the lowest free numbers, the closed one among them
  for (int i = 0; i < 32; ++i) {
    UniqueFd rx, tx;
    ASSERT_EQ(CreateWakePair(&rx, &tx, true), 0);
    reused.push_back(std::move(rx));
    reused.push_back(std::move(tx));
  }
  target.Slot(5)->armed.store(1);  // the target waits for an event on CQ 2
  Send(1, "wake the closed channel");
  EXPECT_EQ(Answer().status, IBV_WC_SUCCESS);
  RingConsumer in;  // the message reached the target (its CQ was "woken")
  in.Attach(to.ring(0), to.ring_bytes);
  RecordHeader h;
  std::vector<char> payload;
  ASSERT_TRUE(NextRecord(in, &h, &payload));
  for (const UniqueFd& fd : reused)
    EXPECT_EQ(DrainWakes(fd.get()), 0) << "the router sent on descriptor " << fd.get();
  EXPECT_EQ(DrainWakes(chan_rx.get()), 0);
}

// Finding 2: the target makes the wake socket it handed the router blocking (O_NONBLOCK
// lives on the open file description they share), fills it and arms its wake word and a
// CQ event word. The router still delivers, answers and serves the next message: it never
// waits on anything a pod holds.
TEST_F(CrossNodeTest, APodThatMakesItsWakeSocketsBlockingCannotStopTheRouter) {
  UniqueFd chan_rx, chan_tx;
  ASSERT_EQ(CreateWakePair(&chan_rx, &chan_tx, true), 0);
  proto::CreateChannel c{};
  c.id = 1;
  ASSERT_EQ(target.Call(c, {chan_tx.get()}).status, 0);
  ASSERT_EQ(target.CreateCq(2, 5, 1), 2u);
  const RawQp to = target.CreateQp(IBV_QPT_RC, 1, kRcRingBytes, 2);
  to.hdr()->credits.posted.store(2);
  const RawQp from = initiator.CreateQp(IBV_QPT_RC);
  ASSERT_EQ(target.Name(to, Ip("10.1.0.1"), from.qpn), EINPROGRESS);
  link = initiator.Connect(from, Ip("10.2.0.1"), to.qpn);
  ASSERT_EQ(link.status, 0);
  for (int fd : {target.wake_tx(), chan_tx.get()}) {
    ASSERT_EQ(::fcntl(fd, F_SETFL, 0), 0);        // blocking, for everyone holding it
    for (int i = 0; i < 5000; ++i) SendWake(fd);  // and full
  }
  target.Slot(proto::kWakeSlot)->armed.store(1);
  target.Slot(5)->armed.store(1);
  Send(1, "wake a full, blocking socket");
  EXPECT_EQ(Answer().status, IBV_WC_SUCCESS);
  target.Slot(proto::kWakeSlot)->armed.store(1);
  Send(2, "and again");
  EXPECT_EQ(Answer().status, IBV_WC_SUCCESS);
  // A new pod of the target's node opens its device as before.
  RawPod other(b, Ip("10.2.0.3"));
  ASSERT_EQ(other.Hello(), 0);
}

// Finding 4: the target leaves its ring's indices where no producer may start from
// (misaligned, close to the end). The router's producer must not write a byte outside that
// ring — here the next ring's header, checked — and the initiator gets an error.
TEST_F(CrossNodeTest, ATargetThatCorruptsItsRingIndicesGetsNoWriteOutsideIt) {
  const RawQp to = target.CreateQp(IBV_QPT_RC, 2, kMinRingBytes);
  to.hdr()->credits.posted.store(1);
  RingHeader* ring = to.ring(0);
  ring->tail.store(kMinRingBytes - 8);
  ring->head.store(kMinRingBytes - 8);
  char canary[sizeof(RingHeader)];
  std::memset(canary, 0x5a, sizeof(canary));
  std::memcpy(static_cast<void*>(to.ring(1)), canary, sizeof(canary));
  const RawQp from = initiator.CreateQp(IBV_QPT_RC);
  ASSERT_EQ(target.Name(to, Ip("10.1.0.1"), from.qpn), EINPROGRESS);
  link = initiator.Connect(from, Ip("10.2.0.1"), to.qpn);
  ASSERT_EQ(link.status, 0);
  Send(1, "into a corrupt ring");
  EXPECT_NE(Answer().status, IBV_WC_SUCCESS);
  EXPECT_EQ(std::memcmp(static_cast<void*>(to.ring(1)), canary, sizeof(canary)), 0);
  EXPECT_EQ(ring->tail.load(), kMinRingBytes - 8u);
}

TEST_F(CrossNodeTest, ALinkThatDiesFailsBothSides) {
  net.Sever("node-a", "node-b");
  const auto ea = initiator.NextEvent();
  const auto eb = target.NextEvent();
  ASSERT_TRUE(ea.has_value());
  ASSERT_TRUE(eb.has_value());
  EXPECT_EQ(ea->type, proto::EventType::kPeerGone);
  EXPECT_EQ(ea->qpn, qa.qpn);
  EXPECT_EQ(eb->type, proto::EventType::kPeerGone);
  EXPECT_EQ(eb->qpn, qb.qpn);
  // A new connection dials a new link.
  const RawQp from = initiator.CreateQp(IBV_QPT_RC);
  const RawQp to = target.CreateQp(IBV_QPT_RC);
  ASSERT_EQ(target.Name(to, Ip("10.1.0.1"), from.qpn), EINPROGRESS);
  EXPECT_EQ(initiator.Connect(from, Ip("10.2.0.1"), to.qpn).status, 0);
}

TEST_F(CrossNodeTest, AConnectToAnAddressNobodyHasWaitsThenFails) {
  const RawQp from = initiator.CreateQp(IBV_QPT_RC);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(initiator.Connect(from, Ip("10.9.9.9"), 0x123).status, EHOSTUNREACH);
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(250));
  // An address whose node is known but where no such QP lives is refused by that node.
  EXPECT_EQ(initiator.Connect(from, Ip("10.2.0.1"), 0xabcdef).status, EHOSTUNREACH);
}

// A UD resolve waits for an unknown address as a connect does (the control plane may lag
// behind a pod that just started), but one the library marks kResolveAgain (it was refused
// that destination before) is refused at once: the sender's ibv_post_send must not be held
// for the resolve timeout at every retry to an address that is gone.
TEST_F(CrossNodeTest, AUdResolveAskedAgainDoesNotWaitForAnUnknownAddress) {
  const RawQp from = initiator.CreateQp(IBV_QPT_UD, kUdRingsPerQp, kUdRingBytes);
  proto::ConnectQp m{};
  m.qpn = from.qpn;
  m.dest_ip = htonl(Ip("10.9.9.9"));
  m.dest_qpn = 0x123;
  const auto resolve = [&] { return initiator.Call(m, {}, nullptr, proto::Op::kResolveUd).status; };
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(resolve(), EHOSTUNREACH);
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(250));
  m.flags = proto::kResolveAgain;
  start = std::chrono::steady_clock::now();
  EXPECT_EQ(resolve(), EHOSTUNREACH);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(250))
      << "it waited for the resolve timeout (300 ms)";
}

TEST_F(CrossNodeTest, AConnectWaitsForAPodThatIsStillStarting) {
  const RawQp from = initiator.CreateQp(IBV_QPT_RC);
  RawPod starting(b, Ip("10.2.0.7"));
  ASSERT_EQ(starting.Hello(), 0);
  const RawQp q = starting.CreateQp(IBV_QPT_RC);
  ASSERT_EQ(starting.Name(q, Ip("10.1.0.1"), from.qpn), EINPROGRESS);
  cluster.Erase(Ip("10.2.0.7"));  // not known yet, as if etcd lagged behind
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    cluster.Set(Ip("10.2.0.7"), b.endpoint());  // the control plane learns of it
  });
  EXPECT_EQ(initiator.Connect(from, Ip("10.2.0.7"), q.qpn).status, 0);
  late.join();
}

// Writes one UD SEND of `text` (with `qkey`) into a proxy's request ring and publishes it,
// without ringing the doorbell.
void PublishDatagram(RawLink& link, const std::string& text, uint32_t qkey = 0) {
  RecordHeader h{};
  h.kind = kRecSend;
  h.flags = kRecFirst | kRecLast;
  h.qkey = qkey;
  ProxyRequest r{};
  r.opcode = IBV_WR_SEND;
  r.length = static_cast<uint32_t>(text.size());
  r.last = 1;
  ASSERT_EQ(AppendRequest(link.producer, h, r, r.length,
                          [&](char* d) { std::memcpy(d, text.data(), text.size()); }),
            RingStatus::kOk);
  link.producer.Publish();
}

TEST_F(CrossNodeTest, UdDatagramsCrossNodesWithTheirQkey) {
  const RawQp from = initiator.CreateQp(IBV_QPT_UD, kUdRingsPerQp, kUdRingBytes);
  const RawQp to = target.CreateQp(IBV_QPT_UD, kUdRingsPerQp, kUdRingBytes);
  to.hdr()->credits.posted.store(1);
  link = initiator.Connect(from, Ip("10.2.0.1"), to.qpn, true);
  ASSERT_EQ(link.status, 0);
  ASSERT_NO_FATAL_FAILURE(PublishDatagram(link, "hello", 0x1234));
  WakeIfArmed(&link.seg.as<QpSegmentHeader>()->doorbell, link.fds[1].get(), true);
  // The datagram lands in a ring of the sender's own, which the target's router announced
  // with who the sender is; UD is not acknowledged.
  Mapping ring;
  RingConsumer in;
  proto::Event announced{};
  ASSERT_TRUE(NextUdRing(target, to, &ring, &in, &announced));
  EXPECT_EQ(announced.qpn, to.qpn);
  EXPECT_EQ(announced.src_ip, Ip("10.1.0.1"));
  EXPECT_EQ(announced.src_qpn, from.qpn);
  const char* p = nullptr;
  RecordHeader got{};
  EXPECT_TRUE(WaitFor([&] { return in.Peek(&got, &p) == RingStatus::kOk; }));
  EXPECT_EQ(got.qkey, 0x1234u);
  EXPECT_EQ(std::string(p, 5), "hello");
  EXPECT_TRUE(NoAnswer(100));
}

// A UD sender's channel whose datagrams wait at the target's router for room in the
// target's ring: kCount datagrams of 1 KiB, more than its 64 KiB ring holds, posted and
// published before the sender's QP goes away. Returns the ring, as the target reads it.
class UdCloseTest : public CrossNodeTest {
 protected:
  static constexpr int kCount = 150;
  static constexpr uint32_t kBytes = 1024;

  void SendAllThenLeave(RingConsumer* in, Mapping* ring) {
    const RawQp from = initiator.CreateQp(IBV_QPT_UD, kUdRingsPerQp, kUdRingBytes);
    const RawQp to = target.CreateQp(IBV_QPT_UD, kUdRingsPerQp, kUdRingBytes);
    to.hdr()->credits.posted.store(kCount);
    link = initiator.Connect(from, Ip("10.2.0.1"), to.qpn, true);
    ASSERT_EQ(link.status, 0);
    for (int i = 0; i < kCount; ++i) {
      RecordHeader h{};
      h.kind = kRecSend;
      h.flags = kRecFirst | kRecLast;
      ProxyRequest r{};
      r.opcode = IBV_WR_SEND;
      r.length = kBytes;
      r.last = 1;
      ASSERT_EQ(AppendRequest(link.producer, h, r, kBytes,
                              [i](char* d) {
                                std::memset(d, 0, kBytes);
                                std::memcpy(d, &i, sizeof(i));
                              }),
                RingStatus::kOk);
    }
    link.producer.Publish();
    WakeIfArmed(&link.seg.as<QpSegmentHeader>()->doorbell, link.fds[1].get(), true);
    proto::Event announced{};
    ASSERT_TRUE(NextUdRing(target, to, ring, in, &announced));
    RecordHeader got{};
    const char* p = nullptr;
    ASSERT_TRUE(WaitFor([&] { return in->Peek(&got, &p) == RingStatus::kOk; }));
    proto::DestroyQp d{};
    d.id = from.qpn;
    ASSERT_EQ(initiator.Call(d).status, 0);
  }

  // Reads the ring until `want` datagrams came or nothing came for 300 ms; how many came,
  // each checked to be the next in order.
  static int ReadAll(RingConsumer* in, int want) {
    int n = 0;
    while (n < want) {
      RecordHeader got{};
      const char* p = nullptr;
      if (!WaitFor([&] { return in->Peek(&got, &p) == RingStatus::kOk; },
                   std::chrono::milliseconds(300)))
        break;
      int index = -1;
      std::memcpy(&index, p, sizeof(index));
      EXPECT_EQ(index, n) << "datagram " << n << " came out of order";
      in->Consume(got);
      in->Release();
      ++n;
    }
    return n;
  }
};

// What was queued at the target's router when the sender left still arrives as the target
// reads (a UD send is complete for its program once posted: udaddy's client lost up to 40
// of its server's 100 replies across nodes when the server exited right after them).
TEST_F(UdCloseTest, DatagramsWaitingForRoomStillArriveAfterTheirSenderLeft) {
  RingConsumer in;
  Mapping ring;
  ASSERT_NO_FATAL_FAILURE(SendAllThenLeave(&in, &ring));
  EXPECT_EQ(ReadAll(&in, kCount), kCount);
}

// Nobody reads: after kUdCloseDrainNs what still waits is dropped (the router holds no
// closed channel for ever); what was in the ring by then stays readable.
TEST_F(UdCloseTest, DatagramsNobodyMakesRoomForAreDroppedInTheEnd) {
  RingConsumer in;
  Mapping ring;
  ASSERT_NO_FATAL_FAILURE(SendAllThenLeave(&in, &ring));
  std::this_thread::sleep_for(std::chrono::nanoseconds(kUdCloseDrainNs) +
                              std::chrono::milliseconds(300));
  const int got = ReadAll(&in, kCount);
  EXPECT_GT(got, 0);
  EXPECT_LT(got, kCount);
}

// A UD QP of one ring (a real one has 16; one ring makes the second sender take it): the
// pod publishes a datagram on its first sender's channel and, before the router served the
// doorbell, asks for a second sender's. What it published first goes first, into the ring it
// was meant for, and the first sender hears that it lost the ring.
TEST_F(CrossNodeTest, APodsDatagramsGoOutBeforeItsNextUdConnectTakesTheirRing) {
  const RawQp first = initiator.CreateQp(IBV_QPT_UD, kUdRingsPerQp, kUdRingBytes);
  const RawQp second = initiator.CreateQp(IBV_QPT_UD, kUdRingsPerQp, kUdRingBytes);
  const RawQp to = target.CreateQp(IBV_QPT_UD, 1, kUdRingBytes);
  to.hdr()->credits.posted.store(2);
  RawLink one = initiator.Connect(first, Ip("10.2.0.1"), to.qpn, true);
  ASSERT_EQ(one.status, 0);
  Mapping ring;
  RingConsumer in;
  proto::Event announced{};
  ASSERT_TRUE(NextUdRing(target, to, &ring, &in, &announced));
  ASSERT_NO_FATAL_FAILURE(PublishDatagram(one, "first"));  // and no doorbell yet
  const RawLink two = initiator.Connect(second, Ip("10.2.0.1"), to.qpn, true);
  ASSERT_EQ(two.status, 0);
  EXPECT_EQ(NextPayload(in), "first");
  const auto lost = initiator.NextEvent();
  ASSERT_TRUE(lost.has_value());
  EXPECT_EQ(lost->type, proto::EventType::kUdPeerLost);
  EXPECT_EQ(lost->qpn, first.qpn);
  EXPECT_EQ(lost->src_ip, Ip("10.2.0.1"));
  EXPECT_EQ(lost->src_qpn, to.qpn);
  Mapping ring2;
  RingConsumer in2;
  ASSERT_TRUE(NextUdRing(target, to, &ring2, &in2, &announced));
  EXPECT_EQ(announced.src_qpn, second.qpn);
}

// The target's router checks that a connect's source is a pod of the node that sent it: a
// source the control plane does not know yet waits for it; one it places on another node is
// refused.
TEST_F(CrossNodeTest, AConnectsSourceMustBeAPodOfTheNodeThatSentIt) {
  RawQp from = initiator.CreateQp(IBV_QPT_RC);
  RawQp to = target.CreateQp(IBV_QPT_RC);
  ASSERT_EQ(target.Name(to, Ip("10.1.0.1"), from.qpn), EINPROGRESS);
  cluster.Erase(Ip("10.1.0.1"));  // its entry is still on its way
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    cluster.Set(Ip("10.1.0.1"), a.endpoint());
  });
  const auto start = std::chrono::steady_clock::now();
  RawLink late = initiator.Connect(from, Ip("10.2.0.1"), to.qpn);
  later.join();
  EXPECT_EQ(late.status, 0);
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(250));

  RawQp forged = initiator.CreateQp(IBV_QPT_RC);
  RawQp victim = target.CreateQp(IBV_QPT_RC);
  ASSERT_EQ(target.Name(victim, Ip("10.1.0.1"), forged.qpn), EINPROGRESS);
  cluster.Set(Ip("10.1.0.1"), {"node-c", Ip("192.168.0.3"), 7471});  // says another node
  EXPECT_EQ(initiator.Connect(forged, Ip("10.2.0.1"), victim.qpn).status, EACCES);
  cluster.Set(Ip("10.1.0.1"), a.endpoint());
}

// A target that posts no receive (RNR retries forever) while its initiator keeps sending:
// the initiator's router stops at the channel's window and everything else on the same link
// goes on; once the target posts receives, every SEND arrives, in order.
TEST_F(CrossNodeTest, ATargetThatPostsNoReceivesHoldsBackOnlyItsOwnChannel) {
  const std::string big(kMaxFragment, 'f');
  const uint64_t record = sizeof(RecordHeader) + sizeof(ProxyRequest) + kMaxFragment;
  uint32_t posted = 0;
  while (posted < 2 * kChannelWindow / record &&
         PostSend(link, posted, big, 7, std::chrono::milliseconds(300)) == RingStatus::kOk)
    ++posted;
  // The window plus what the proxy ring holds, and no more, left the initiating pod.
  EXPECT_GE(posted * record, kChannelWindow);
  EXPECT_LT(posted * record, kChannelWindow + kProxyRingBytes + record);
  EXPECT_TRUE(NoAnswer(50));

  // A second pair across the same two routers, so the same link: served at once.
  RawPod other_initiator{a, Ip("10.1.0.2")};
  RawPod other_target{b, Ip("10.2.0.2")};
  ASSERT_EQ(other_initiator.Hello(), 0);
  ASSERT_EQ(other_target.Hello(), 0);
  RawQp from = other_initiator.CreateQp(IBV_QPT_RC);
  RawQp to = other_target.CreateQp(IBV_QPT_RC);
  ASSERT_EQ(other_target.Name(to, Ip("10.1.0.2"), from.qpn), EINPROGRESS);
  RawLink second = other_initiator.Connect(from, Ip("10.2.0.2"), to.qpn);
  ASSERT_EQ(second.status, 0);
  to.hdr()->credits.posted.store(20);
  RingConsumer to_ring;
  to_ring.Attach(to.ring(0), to.ring_bytes);
  for (uint32_t i = 0; i < 20; ++i) {
    ASSERT_EQ(PostSend(second, i, "ping " + std::to_string(i)), RingStatus::kOk);
    RecordHeader h;
    std::vector<char> payload;
    ASSERT_TRUE(NextRecord(to_ring, &h, &payload, std::chrono::milliseconds(1000))) << i;
    const std::optional<ProxyResponse> r = NextAnswer(second, nullptr, std::chrono::seconds(1));
    ASSERT_TRUE(r.has_value()) << i;
    EXPECT_EQ(r->status, IBV_WC_SUCCESS);
  }

  // The stalled channel resumes with nothing lost.
  qb.hdr()->credits.posted.store(posted);
  for (uint32_t i = 0; i < posted; ++i) {
    RecordHeader h;
    std::vector<char> payload;
    ASSERT_TRUE(NextRecord(inbound, &h, &payload)) << i;
    EXPECT_EQ(payload.size(), big.size());
    const ProxyResponse r = Answer();
    EXPECT_EQ(r.seq, i);
    EXPECT_EQ(r.status, IBV_WC_SUCCESS);
  }
}

// A slow network: the link's high-water mark is 64 KiB and node B takes nothing while paused.
class CrossNodeBackPressureTest : public CrossNodeTest {
 protected:
  CrossNodeBackPressureTest() : CrossNodeTest(64 * 1024) {}
};

TEST_F(CrossNodeBackPressureTest, ACongestedLinkPausesForwardingAndLosesNothing) {
  Mapping memory;
  const uint32_t rkey = target.Register(1, 1 << 20, kAll, kAddr, &memory);
  net.Pause("node-b", true);
  const std::vector<char> chunk(kMaxFragment, 'z');
  constexpr uint32_t kWrites = 12;  // 384 KiB: well past the high-water mark
  for (uint32_t i = 0; i < kWrites; ++i) {
    ProxyRequest w{};
    w.opcode = IBV_WR_RDMA_WRITE;
    w.rkey = rkey;
    w.seq = i;
    w.length = kMaxFragment;
    w.remote_addr = kAddr + i * kMaxFragment;
    w.last = 1;
    Post(kRecWrite, 0, w, chunk.data(), kMaxFragment);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const uint64_t sent_while_paused = net.messages_sent();
  RecordHeader h;
  const char* p;
  RingConsumer left;  // what the router has not taken from the proxy yet
  left.Attach(QpRing(link.seg.get(), kProxyRequestRing, link.reply.ring_bytes),
              link.reply.ring_bytes);
  EXPECT_EQ(left.Peek(&h, &p), RingStatus::kOk) << "the forwarder kept draining a congested link";
  EXPECT_LT(sent_while_paused, 2u + kWrites);
  net.Pause("node-b", false);
  for (uint32_t i = 0; i < kWrites; ++i) {
    const ProxyResponse r = Answer();
    EXPECT_EQ(r.seq, i);
    EXPECT_EQ(r.status, IBV_WC_SUCCESS);
  }
  EXPECT_EQ(std::string(memory.as<char>() + (kWrites - 1) * kMaxFragment, 4), "zzzz");
}

// A peer that sends what no router would: only its link is closed.
// A peer that sends what no router would, on a link it dialled: a record that is not a
// request, or an answer (answers travel only on links the receiver dialled). Only that link
// is closed; the router goes on serving.
TEST_F(CrossNodeTest, AMalformedOrMisdirectedMessageClosesOnlyTheLinkThatCarriedIt) {
  struct Recorder final : NodeTransport::Handler {
    Verdict OnMessage(LinkId, const NodeMessage&) override { return Verdict::kConsumed; }
    void OnDrained(LinkId) override {}
    void OnLinkDown(LinkId, const std::string&) override { down = true; }
    bool down = false;
  };
  const char garbage[64] = {1, 2, 3};
  const wire::ConnectReply reply{0, 1, 2, IBV_QPT_RC};
  const RecordHeader resp = ResponseHeader(0);
  const ProxyResponse answer{0, 1, 0, 1, 0};
  const auto attacks = {
      std::make_pair(wire::Type::kRecord, std::vector<Bytes>{{garbage, sizeof(garbage)}}),
      std::make_pair(wire::Type::kConnectReply, std::vector<Bytes>{{&reply, sizeof(reply)}}),
      std::make_pair(wire::Type::kResp,
                     std::vector<Bytes>{{&resp, sizeof(resp)}, {&answer, sizeof(answer)}}),
  };
  for (const auto& [type, parts] : attacks) {
    Recorder recorder;
    EventLoop loop;
    ASSERT_EQ(loop.Init(), 0);
    std::unique_ptr<NodeTransport> evil = net.Attach({"evil", Ip("192.168.0.66"), 7471});
    std::string error;
    ASSERT_TRUE(evil->Start(loop, recorder, &error));
    const LinkId l = evil->Dial(b.endpoint());
    ASSERT_NE(l, kNoLink);
    if (parts.size() == 1) {
      evil->Send(l, type, 1, 0, {parts[0]});
    } else {
      evil->Send(l, type, 1, 0, {parts[0], parts[1]});
    }
    EXPECT_TRUE(WaitFor([&] {
      loop.RunOnce(1);
      return recorder.down;
    })) << static_cast<int>(type);
  }
  qb.hdr()->credits.posted.store(1);
  Send(9, "still served");
  EXPECT_EQ(Answer().status, IBV_WC_SUCCESS);
}

// A router at 192.168.0.66 holding 10.66.0.1 that records the connects it is sent and answers
// them only as a test tells it.
class EvilRouter final : public NodeTransport::Handler {
 public:
  EvilRouter(LoopbackNetwork& net, FakeCluster& cluster) {
    EXPECT_EQ(loop_.Init(), 0);
    const cp::Endpoint where{"evil", Ip("192.168.0.66"), 7471};
    transport_ = net.Attach(where);
    std::string error;
    EXPECT_TRUE(transport_->Start(loop_, *this, &error)) << error;
    cluster.Set(Ip("10.66.0.1"), where);
  }
  Verdict OnMessage(LinkId l, const NodeMessage& m) override {
    if (m.type == wire::Type::kConnect) {
      link_ = l;
      chan_ = m.chan;
    }
    return Verdict::kConsumed;
  }
  void OnDrained(LinkId) override {}
  void OnLinkDown(LinkId, const std::string&) override { down_ = true; }

  // `pod` connects `qp` to a QP of ours; true once its router's kConnect arrived.
  bool Connected(RawPod& pod, const RawQp& qp) {
    link_ = kNoLink;
    down_ = false;
    proto::ConnectQp m{};
    m.qpn = qp.qpn;
    m.dest_ip = htonl(Ip("10.66.0.1"));
    m.dest_qpn = 0x100;
    pod.SendRaw(&m, sizeof(m));
    return Pump([&] { return link_ != kNoLink; });
  }
  // Sends `type` with `body` on the channel of the last connect.
  template <typename T>
  void Say(wire::Type type, const T& body) {
    transport_->Send(link_, type, chan_, 0, {{&body, sizeof(body)}});
  }
  bool Closed() {
    return Pump([&] { return down_; });
  }

 private:
  template <typename Pred>
  bool Pump(Pred pred) {
    return WaitFor([&] {
      loop_.RunOnce(1);
      return pred();
    });
  }
  EventLoop loop_;
  std::unique_ptr<NodeTransport> transport_;
  LinkId link_ = kNoLink;
  uint32_t chan_ = 0;
  bool down_ = false;
};

// A peer that answers a connect with a status that is neither 0 nor an errno: the initiator
// gets EPROTO and the link is closed.
TEST_F(CrossNodeTest, AConnectAnswerWithAnInvalidStatusIsRefused) {
  EvilRouter evil(net, cluster);
  for (int32_t status : {-6, 4096, INT32_MIN}) {
    RawQp qp = initiator.CreateQp(IBV_QPT_RC);
    ASSERT_TRUE(evil.Connected(initiator, qp));
    evil.Say(wire::Type::kConnectReply,
             wire::ConnectReply{status, 0x100, Ip("10.66.0.1"), IBV_QPT_RC});
    EXPECT_TRUE(evil.Closed()) << status;
    EXPECT_EQ(initiator.Receive().status, EPROTO) << status;
  }
  qb.hdr()->credits.posted.store(1);
  Send(9, "still served");
  EXPECT_EQ(Answer().status, IBV_WC_SUCCESS);
}

// A peer that credits a channel with more than was ever sent on it: the link is closed and
// the QP that used it fails, instead of the window opening past its size.
TEST_F(CrossNodeTest, ACreditForRecordsNeverSentClosesTheLink) {
  EvilRouter evil(net, cluster);
  RawQp qp = initiator.CreateQp(IBV_QPT_RC);
  ASSERT_TRUE(evil.Connected(initiator, qp));
  evil.Say(wire::Type::kConnectReply, wire::ConnectReply{0, 0x100, Ip("10.66.0.1"), IBV_QPT_RC});
  EXPECT_EQ(initiator.Receive().status, 0);
  evil.Say(wire::Type::kCredit, wire::Credit{1});
  EXPECT_TRUE(evil.Closed());
  const std::optional<proto::Event> gone = initiator.NextEvent();
  ASSERT_TRUE(gone.has_value());
  EXPECT_EQ(gone->type, proto::EventType::kPeerGone);
  EXPECT_EQ(gone->qpn, qp.qpn);
  qb.hdr()->credits.posted.store(1);
  Send(9, "still served");
  EXPECT_EQ(Answer().status, IBV_WC_SUCCESS);
}

}  // namespace
}  // namespace ff::router::test
