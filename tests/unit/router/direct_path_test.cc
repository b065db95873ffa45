// The routers' side of direct connections (docs/direct-path.md): two routers with
// --cross-node-path=direct joined by the in-memory node transport, raw pods on each, and
// the set-up as the libraries see it: the connect answer (where to dial, with what), the
// channel and connection events, reuse of one connection by every QP pair of the same two
// processes in either direction, forgetting, the relay when either router runs it, and
// replies a router refuses. The pods' addresses are on loopback (127.0.0.0/8 is the overlay
// here), so that the acceptor's listener binds in the test's own namespace and a real TCP
// dial reaches it.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "freeflow/direct_stream.h"
#include "freeflow/protocol/direct_wire.h"
#include "harness.h"
#include "log_capture.h"

namespace ff::router::test {
namespace {

const uint32_t kPodA = Ip("127.1.0.1");
const uint32_t kPodB = Ip("127.2.0.1");

TestRouter::Options Node(const char* name, const char* host, LoopbackNetwork* net,
                         FakeCluster* cluster, bool direct = true) {
  TestRouter::Options o;
  o.node = name;
  o.host_ip = Ip(host);
  o.network = net;
  o.cluster = cluster;
  o.overlay = "127.0.0.0/8";
  o.direct = direct;
  return o;
}

bool Zero(const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (p[i] != 0) return false;
  return true;
}

// One QP pair: `from`'s QP connected to `to`'s, which named it first.
struct Pair {
  RawQp from, to;
  RawLink link;
};

// `from` (at from_ip) connects a new RC QP to a new RC QP of `to` (at to_ip).
Pair Connect(RawPod& from, uint32_t from_ip, RawPod& to, uint32_t to_ip) {
  Pair p;
  p.from = from.CreateQp(IBV_QPT_RC);
  p.to = to.CreateQp(IBV_QPT_RC);
  EXPECT_EQ(to.Name(p.to, from_ip, p.from.qpn), EINPROGRESS);
  p.link = from.Connect(p.from, to_ip, p.to.qpn);
  return p;
}

// What the dialler's library does with a kConnectDirectNew answer: a TCP connection from
// its own address to (peer, port), its sealed hello first, then `after`.
UniqueFd Dial(uint32_t from, uint32_t to, const proto::ConnectReply& c, const std::string& after) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in src{};
  src.sin_family = AF_INET;
  src.sin_addr.s_addr = htonl(from);
  EXPECT_EQ(::bind(fd.get(), reinterpret_cast<sockaddr*>(&src), sizeof(src)), 0);
  sockaddr_in dst{};
  dst.sin_family = AF_INET;
  dst.sin_addr.s_addr = c.peer_ip;
  dst.sin_port = htons(c.direct_port);
  EXPECT_EQ(ntohl(c.peer_ip), to);
  EXPECT_EQ(::connect(fd.get(), reinterpret_cast<sockaddr*>(&dst), sizeof(dst)), 0)
      << std::strerror(errno);
  const direct::Hello hello{direct::kMagic, direct::kVersion, c.direct_conn, from, to};
  char frame[direct::kHelloFrameBytes];
  EXPECT_TRUE(SealHello(c.direct_secret, static_cast<SealMode>(c.direct_seal), hello, frame));
  std::string bytes(frame, sizeof(frame));
  bytes += after;
  EXPECT_EQ(::send(fd.get(), bytes.data(), bytes.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(bytes.size()));
  return fd;
}

std::string ReadSome(int fd, size_t n) {
  std::string got;
  while (got.size() < n) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 3000) <= 0) break;
    char buf[256];
    const ssize_t r = ::recv(fd, buf, std::min(sizeof(buf), n - got.size()), 0);
    if (r <= 0) break;
    got.append(buf, static_cast<size_t>(r));
  }
  return got;
}

void PostDirectEnded(RawPod& pod, uint64_t conn, int error) {
  proto::DirectEnded m{};
  m.h.seq = proto::kPostedSeq;
  m.conn = conn;
  m.error = static_cast<uint32_t>(error);
  pod.SendRaw(&m, sizeof(m));
  EXPECT_TRUE(pod.Flush());
}

// The next kDirectChannel or kDirectConn event of `pod` (kPeerNamed, which a target QP that
// named its peer first hears when the peer connects, is skipped).
std::optional<RawPod::SetupEvent> NextDirect(RawPod& pod, int timeout_ms = 3000) {
  std::optional<RawPod::SetupEvent> e = pod.NextSetupEvent(timeout_ms);
  while (e && e->event.type == proto::EventType::kPeerNamed) e = pod.NextSetupEvent(timeout_ms);
  return e;
}

// `qp` of `pod` names its peer without linking (NameQp).
void NameOnly(RawPod& pod, const RawQp& qp, uint32_t peer_ip, uint32_t peer_qpn) {
  proto::NameQp m{};
  m.qpn = qp.qpn;
  m.dest_ip = htonl(peer_ip);
  m.dest_qpn = peer_qpn;
  ASSERT_EQ(pod.Call(m).status, 0);
}

// The kDirectChannel event `pod` must have been sent already.
void ExpectChannel(RawPod& pod, const Pair& p, uint32_t src_ip, int timeout_ms = 0) {
  const std::optional<RawPod::SetupEvent> e = NextDirect(pod, timeout_ms);
  ASSERT_TRUE(e.has_value()) << "no channel event";
  EXPECT_EQ(e->event.type, proto::EventType::kDirectChannel);
  EXPECT_EQ(e->event.qpn, p.to.qpn);
  EXPECT_EQ(e->event.ring, 0u);
  EXPECT_EQ(e->event.src_ip, src_ip);
  EXPECT_EQ(e->event.src_qpn, p.from.qpn);
  EXPECT_EQ(e->event.chan, p.link.reply.direct_chan);
  EXPECT_EQ(e->event.conn, p.link.reply.direct_conn);
  EXPECT_FALSE(e->fd);
}

class DirectPathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(pa.Hello(), 0);
    ASSERT_EQ(pb.Hello(), 0);
  }
  // The first QP pair of pa and pb, a new connection, dialled by the test as pa's library.
  Pair First() {
    Pair p = Connect(pa, kPodA, pb, kPodB);
    EXPECT_EQ(p.link.status, 0);
    ExpectChannel(pb, p, kPodA);
    return p;
  }

  LoopbackNetwork net;
  FakeCluster cluster;
  TestRouter a{Node("node-a", "192.168.0.1", &net, &cluster)};
  TestRouter b{Node("node-b", "192.168.0.2", &net, &cluster)};
  RawPod pa{a, kPodA};
  RawPod pb{b, kPodB};
};

// The initiator's library learns where to dial, with what, and its channel; the target's
// learns the channel before the initiator's answer leaves, and gets the accepted socket,
// its hello consumed.
TEST_F(DirectPathTest, AFirstQpPairGetsANewConnectionThatTheTargetsRouterAccepts) {
  Pair p = Connect(pa, kPodA, pb, kPodB);
  ASSERT_EQ(p.link.status, 0);
  const proto::ConnectReply& c = p.link.reply;
  EXPECT_EQ(c.flags, proto::kConnectDirect | proto::kConnectDirectNew);
  EXPECT_TRUE(p.link.fds.empty()) << "a direct channel has no segment";
  EXPECT_EQ(proto::ConnectReplyFds(c), 0);
  EXPECT_EQ(c.peer_qpn, p.to.qpn);
  EXPECT_EQ(ntohl(c.peer_ip), kPodB);
  EXPECT_EQ(c.peer_qp_type, static_cast<uint32_t>(IBV_QPT_RC));
  EXPECT_NE(c.direct_chan, 0u);
  EXPECT_NE(c.direct_conn, 0u);
  EXPECT_NE(c.direct_port, 0u);
  EXPECT_EQ(c.direct_seal, static_cast<uint8_t>(SealMode::kEncrypt));
  EXPECT_FALSE(Zero(c.direct_secret, sizeof(c.direct_secret)));
  // Sent before the reply left router B: already there when the initiator has its answer.
  ExpectChannel(pb, p, kPodA, 0);

  UniqueFd dialler = Dial(kPodA, kPodB, c, "first frame");
  const std::optional<RawPod::SetupEvent> conn = NextDirect(pb);
  ASSERT_TRUE(conn.has_value());
  EXPECT_EQ(conn->event.type, proto::EventType::kDirectConn);
  EXPECT_EQ(conn->event.conn, c.direct_conn);
  EXPECT_EQ(conn->event.src_ip, kPodA);
  EXPECT_EQ(conn->event.seal, static_cast<uint32_t>(SealMode::kEncrypt));
  EXPECT_EQ(std::memcmp(conn->event.secret, c.direct_secret, sizeof(c.direct_secret)), 0);
  ASSERT_TRUE(conn->fd);
  EXPECT_EQ(ReadSome(conn->fd.get(), 11), "first frame") << "the hello was the router's";
  ASSERT_EQ(::send(conn->fd.get(), "back", 4, MSG_NOSIGNAL), 4);
  EXPECT_EQ(ReadSome(dialler.get(), 4), "back");
  EXPECT_EQ(a.Stat("direct_conns"), 1u);
  EXPECT_EQ(b.Stat("direct_conns"), 1u);
  EXPECT_EQ(b.Stat("direct_listeners"), 0u);
  EXPECT_EQ(a.Stat("proxies"), 1u) << "the proxy stays for the channel's lifetime";
  EXPECT_FALSE(pa.NextEvent(50).has_value());
}

TEST_F(DirectPathTest, TheNextQpPairOfTheSameProcessesSharesTheConnection) {
  const Pair first = First();
  const Pair second = Connect(pa, kPodA, pb, kPodB);
  ASSERT_EQ(second.link.status, 0);
  const proto::ConnectReply& c = second.link.reply;
  EXPECT_EQ(c.flags, proto::kConnectDirect);
  EXPECT_EQ(c.direct_conn, first.link.reply.direct_conn);
  EXPECT_NE(c.direct_chan, first.link.reply.direct_chan);
  EXPECT_EQ(c.direct_port, 0u);
  EXPECT_TRUE(Zero(c.direct_secret, sizeof(c.direct_secret))) << "the secret goes once";
  ExpectChannel(pb, second, kPodA);
  EXPECT_EQ(b.Stat("direct_conns"), 1u);
  EXPECT_EQ(b.Stat("direct_listeners"), 1u) << "the first one's, still waiting for its dial";
}

// Another process of the same pod is another pair: a connection of its own.
TEST_F(DirectPathTest, AnotherProcessOfThePodGetsAConnectionOfItsOwn) {
  const Pair first = First();
  RawPod pa2{a, kPodA};
  ASSERT_EQ(pa2.Hello(), 0);
  const Pair other = Connect(pa2, kPodA, pb, kPodB);
  ASSERT_EQ(other.link.status, 0);
  EXPECT_EQ(other.link.reply.flags, proto::kConnectDirect | proto::kConnectDirectNew);
  EXPECT_NE(other.link.reply.direct_conn, first.link.reply.direct_conn);
}

TEST_F(DirectPathTest, AQpPairTheOtherWayRoundSharesTheConnectionToo) {
  const Pair first = First();
  const Pair back = Connect(pb, kPodB, pa, kPodA);
  ASSERT_EQ(back.link.status, 0);
  EXPECT_EQ(back.link.reply.flags, proto::kConnectDirect);
  EXPECT_EQ(back.link.reply.direct_conn, first.link.reply.direct_conn);
  EXPECT_EQ(ntohl(back.link.reply.peer_ip), kPodA);
  ExpectChannel(pa, back, kPodB);
  EXPECT_EQ(a.Stat("direct_conns"), 1u);
  EXPECT_EQ(b.Stat("direct_conns"), 1u);
}

// Both programs move their QPs of a pair to RTR at once (perftest, UCX and MPI do): the two
// asks cross on the node link. One connection must come of it, or each direction's answers
// would travel apart from the other direction's data. Delivery between the routers is held
// until both asks are on their way, so that they cross every time.
TEST_F(DirectPathTest, TwoAsksThatCrossMakeOneConnection) {
  const RawQp x = pa.CreateQp(IBV_QPT_RC);
  const RawQp y = pb.CreateQp(IBV_QPT_RC);
  NameOnly(pa, x, kPodB, y.qpn);
  NameOnly(pb, y, kPodA, x.qpn);
  const uint64_t before = net.messages_sent();
  net.Pause("node-a", true);
  net.Pause("node-b", true);
  RawLink from_a, from_b;
  std::thread ta([&] { from_a = pa.Connect(x, kPodB, y.qpn); });
  std::thread tb([&] { from_b = pb.Connect(y, kPodA, x.qpn); });
  EXPECT_TRUE(WaitFor([&] { return net.messages_sent() >= before + 2; }))
      << "both connects must be on the links";
  net.Pause("node-a", false);
  net.Pause("node-b", false);
  ta.join();
  tb.join();
  ASSERT_EQ(from_a.status, 0);
  ASSERT_EQ(from_b.status, 0);
  EXPECT_EQ(from_a.reply.direct_conn, from_b.reply.direct_conn)
      << "each direction on a connection of its own";
  // One of the two made it (its library dials), the other shares it.
  EXPECT_EQ(((from_a.reply.flags & proto::kConnectDirectNew) != 0) +
                ((from_b.reply.flags & proto::kConnectDirectNew) != 0),
            1);
  EXPECT_EQ(a.Stat("direct_conns"), 1u);
  EXPECT_EQ(b.Stat("direct_conns"), 1u);
}

// Both libraries report the connection's end: the next QP pair makes a new one. A dial the
// pod network refused is one line in the dialler's router's log.
TEST_F(DirectPathTest, AConnectionBothEndsReportEndedIsForgotten) {
  const Pair first = First();
  const uint64_t conn = first.link.reply.direct_conn;
  {
    ff::testing::LogCapture log(spdlog::level::info);
    PostDirectEnded(pa, conn, ECONNREFUSED);
    EXPECT_EQ(log.Count({"client", "127.1.0.1", "refused its direct connection to 127.2.0.1",
                         std::to_string(first.link.reply.direct_port).c_str(), "Connection refused",
                         "NetworkPolicy"}),
              1);
  }
  PostDirectEnded(pb, conn, ECONNRESET);
  EXPECT_EQ(a.Stat("direct_conns"), 0u);
  EXPECT_EQ(b.Stat("direct_conns"), 0u);
  const Pair next = Connect(pa, kPodA, pb, kPodB);
  ASSERT_EQ(next.link.status, 0);
  EXPECT_EQ(next.link.reply.flags, proto::kConnectDirect | proto::kConnectDirectNew);
  EXPECT_NE(next.link.reply.direct_conn, conn);
  // Reported again, or never known: nothing happens.
  PostDirectEnded(pa, conn, ECONNREFUSED);
  PostDirectEnded(pa, 12345, 0);
  EXPECT_EQ(a.Stat("direct_conns"), 1u);
}

// Only the initiator's side has forgotten the connection (its library reported its end, the
// target's has not yet): the target's router still shares it, and the initiator's refuses
// that answer (ECONNRESET) and closes the channel there, without harm to the link.
TEST_F(DirectPathTest, AConnectionThatEndedOnOneSideOnlyFailsThatConnect) {
  const Pair first = First();
  const uint64_t links = b.Stat("links");
  PostDirectEnded(pa, first.link.reply.direct_conn, ECONNRESET);
  const Pair stale = Connect(pa, kPodA, pb, kPodB);
  EXPECT_EQ(stale.link.status, ECONNRESET);
  const std::optional<RawPod::SetupEvent> channel = NextDirect(pb);
  ASSERT_TRUE(channel.has_value());
  EXPECT_EQ(channel->event.type, proto::EventType::kDirectChannel);
  EXPECT_EQ(channel->event.conn, first.link.reply.direct_conn);
  const std::optional<proto::Event> gone = pb.NextEvent();
  ASSERT_TRUE(gone.has_value());
  EXPECT_EQ(gone->type, proto::EventType::kDirectChannelGone);
  EXPECT_EQ(gone->qpn, stale.to.qpn);
  EXPECT_EQ(b.Stat("links"), links) << "no link went down";
  PostDirectEnded(pb, first.link.reply.direct_conn, ECONNRESET);
  const Pair next = Connect(pa, kPodA, pb, kPodB);
  ASSERT_EQ(next.link.status, 0);
  EXPECT_EQ(next.link.reply.flags, proto::kConnectDirect | proto::kConnectDirectNew);
}

// A listener nobody dials gives up: the target's router forgets the connection, and the
// next QP pair gets a new one.
TEST(DirectPathListenerTest, AConnectionNeverDialledIsForgottenWhenItsListenerGivesUp) {
  LoopbackNetwork net;
  FakeCluster cluster;
  TestRouter a{Node("node-a", "192.168.0.1", &net, &cluster)};
  TestRouter::Options ob = Node("node-b", "192.168.0.2", &net, &cluster);
  ob.direct_accept_timeout_ns = 100'000'000;
  TestRouter b{ob};
  RawPod pa{a, kPodA};
  RawPod pb{b, kPodB};
  ASSERT_EQ(pa.Hello(), 0);
  ASSERT_EQ(pb.Hello(), 0);
  const Pair first = Connect(pa, kPodA, pb, kPodB);
  ASSERT_EQ(first.link.status, 0);
  ASSERT_EQ(b.Stat("direct_listeners"), 1u);
  EXPECT_TRUE(WaitFor([&] { return b.Stat("direct_conns") == 0; }));
  EXPECT_EQ(b.Stat("direct_listeners"), 0u);
  const Pair next = Connect(pa, kPodA, pb, kPodB);
  ASSERT_EQ(next.link.status, 0);
  EXPECT_EQ(next.link.reply.flags, proto::kConnectDirect | proto::kConnectDirectNew);
  EXPECT_NE(next.link.reply.direct_conn, first.link.reply.direct_conn);
}

TEST_F(DirectPathTest, ASessionThatEndsTakesItsConnectionsWithIt) {
  {
    RawPod other{b, kPodB};
    ASSERT_EQ(other.Hello(), 0);
    const Pair p = Connect(pa, kPodA, other, kPodB);
    ASSERT_EQ(p.link.status, 0);
    EXPECT_EQ(b.Stat("direct_conns"), 1u);
  }
  EXPECT_TRUE(WaitFor([&] { return b.Stat("direct_conns") == 0; }));
  First();
  EXPECT_EQ(a.Stat("direct_conns"), 2u);
}

// The initiator closes its QP: the target's library hears the channel is gone (kClose), and
// its QP that the peer is closed, as for a relayed channel.
TEST_F(DirectPathTest, AClosedChannelIsGoneForTheTarget) {
  const Pair p = First();
  proto::DestroyQp d{};
  d.id = p.from.qpn;
  ASSERT_EQ(pa.Call(d).status, 0);
  std::optional<proto::Event> e = pb.NextEvent();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->type, proto::EventType::kDirectChannelGone);
  EXPECT_EQ(e->qpn, p.to.qpn);
  EXPECT_EQ(e->chan, p.link.reply.direct_chan);
  EXPECT_EQ(e->conn, p.link.reply.direct_conn);
  e = pb.NextEvent();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->type, proto::EventType::kPeerClosed);
  EXPECT_EQ(e->qpn, p.to.qpn);
  EXPECT_TRUE(WaitFor([&] { return b.Stat("senders") == 0; }));
  EXPECT_EQ(b.Stat("direct_conns"), 1u) << "the connection outlives its channels";
}

// The target closes its QP: the initiator's library hears it as for a relayed channel
// (kPeerGone from the peer router), and the target's that the channel is gone.
TEST_F(DirectPathTest, ATargetQpThatGoesAwayEndsTheChannelOnBothSides) {
  const Pair p = First();
  proto::DestroyQp d{};
  d.id = p.to.qpn;
  ASSERT_EQ(pb.Call(d).status, 0);
  std::optional<proto::Event> e = pb.NextEvent();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->type, proto::EventType::kDirectChannelGone);
  EXPECT_EQ(e->chan, p.link.reply.direct_chan);
  e = pa.NextEvent();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->type, proto::EventType::kPeerClosed);
  EXPECT_EQ(e->qpn, p.from.qpn);
}

TEST_F(DirectPathTest, ALinkThatGoesDownFailsTheInitiatorsQpAndEndsTheTargetsChannel) {
  const Pair p = First();
  net.Sever("node-a", "node-b");
  std::optional<proto::Event> e = pa.NextEvent();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->type, proto::EventType::kPeerGone);
  EXPECT_EQ(e->qpn, p.from.qpn);
  e = pb.NextEvent();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->type, proto::EventType::kDirectChannelGone);
  e = pb.NextEvent();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->type, proto::EventType::kPeerGone);
}

// Either router in relay mode: the channel is relayed, with a proxy segment, as before.
TEST(DirectPathRelayTest, APeerRouterThatRelaysGetsTheRelayAnswer) {
  for (bool initiator_direct : {true, false}) {
    LoopbackNetwork net;
    FakeCluster cluster;
    TestRouter a{Node("node-a", "192.168.0.1", &net, &cluster, initiator_direct)};
    TestRouter b{Node("node-b", "192.168.0.2", &net, &cluster, !initiator_direct)};
    RawPod pa{a, kPodA};
    RawPod pb{b, kPodB};
    ASSERT_EQ(pa.Hello(), 0);
    ASSERT_EQ(pb.Hello(), 0);
    Pair p = Connect(pa, kPodA, pb, kPodB);
    ASSERT_EQ(p.link.status, 0);
    EXPECT_EQ(p.link.reply.flags, proto::kConnectRemote) << initiator_direct;
    ASSERT_EQ(p.link.fds.size(), 2u);
    EXPECT_EQ(p.link.reply.direct_conn, 0u);
    p.to.hdr()->credits.posted.store(1);
    ASSERT_EQ(PostSend(p.link, 1, "relayed"), RingStatus::kOk);
    RingConsumer in;
    in.Attach(p.to.ring(0), p.to.ring_bytes);
    EXPECT_EQ(NextPayload(in), "relayed");
    EXPECT_FALSE(NextDirect(pb, 50).has_value()) << "no channel event";
    EXPECT_EQ(a.Stat("direct_conns") + b.Stat("direct_conns"), 0u);
  }
}

// With --direct-datagrams UD goes direct too: the datagram's destination process gets the channel
// with a ring of the sender's own, the memfd both with kUdRing (whose it is) and with
// kDirectChannel (to produce into), before the sender's answer leaves; the sender is answered as
// for RC.
TEST_F(DirectPathTest, UdGoesDirectIntoARingOfTheSendersOwn) {
  RawQp ua = pa.CreateQp(IBV_QPT_UD);
  RawQp ub = pb.CreateQp(IBV_QPT_UD, 1, kUdRingBytes);
  RawLink l = pa.Connect(ua, kPodB, ub.qpn, true);
  ASSERT_EQ(l.status, 0);
  EXPECT_EQ(l.reply.flags, proto::kConnectDirect | proto::kConnectDirectNew);
  EXPECT_TRUE(l.fds.empty()) << "a direct channel has no segment";
  EXPECT_EQ(l.reply.peer_qp_type, static_cast<uint32_t>(IBV_QPT_UD));
  const std::optional<RawPod::SetupEvent> ring = NextDirect(pb, 0);
  ASSERT_TRUE(ring.has_value());
  EXPECT_EQ(ring->event.type, proto::EventType::kUdRing);
  EXPECT_EQ(ring->event.qpn, ub.qpn);
  EXPECT_EQ(ring->event.src_ip, kPodA);
  EXPECT_EQ(ring->event.src_qpn, ua.qpn);
  ASSERT_TRUE(ring->fd);
  const std::optional<RawPod::SetupEvent> chan = NextDirect(pb, 0);
  ASSERT_TRUE(chan.has_value());
  EXPECT_EQ(chan->event.type, proto::EventType::kDirectChannel);
  EXPECT_EQ(chan->event.qpn, ub.qpn);
  EXPECT_EQ(chan->event.ring, ring->event.ring);
  EXPECT_EQ(chan->event.src_ip, kPodA);
  EXPECT_EQ(chan->event.src_qpn, ua.qpn);
  EXPECT_EQ(chan->event.chan, l.reply.direct_chan);
  EXPECT_EQ(chan->event.conn, l.reply.direct_conn);
  ASSERT_TRUE(chan->fd) << "the ring to produce into";
  struct stat x = {};
  struct stat y = {};
  ASSERT_EQ(::fstat(ring->fd.get(), &x), 0);
  ASSERT_EQ(::fstat(chan->fd.get(), &y), 0);
  EXPECT_EQ(x.st_ino, y.st_ino) << "one ring";
  EXPECT_EQ(static_cast<size_t>(y.st_size), UdRingBytes(kUdRingBytes));
  EXPECT_EQ(a.Stat("proxies"), 1u);
  EXPECT_EQ(a.Stat("direct_conns"), 1u);

  // A second sender of the pod takes the ring over (one ring here): the first one's channel
  // is gone for the target, and the first sender's library hears its link is lost.
  RawQp ua2 = pa.CreateQp(IBV_QPT_UD);
  RawLink l2 = pa.Connect(ua2, kPodB, ub.qpn, true);
  ASSERT_EQ(l2.status, 0);
  EXPECT_EQ(l2.reply.flags, proto::kConnectDirect) << "the same connection";
  EXPECT_EQ(l2.reply.direct_conn, l.reply.direct_conn);
  const std::optional<proto::Event> went = pb.NextEvent();
  ASSERT_TRUE(went.has_value());
  EXPECT_EQ(went->type, proto::EventType::kDirectChannelGone);
  EXPECT_EQ(went->chan, l.reply.direct_chan);
  const std::optional<proto::Event> lost = pa.NextEvent();
  ASSERT_TRUE(lost.has_value());
  EXPECT_EQ(lost->type, proto::EventType::kUdPeerLost);
  EXPECT_EQ(lost->qpn, ua.qpn);
  EXPECT_EQ(lost->src_qpn, ub.qpn);
}

// Two routers running direct without --direct-datagrams, the routers' default.
class DirectPathDatagramsOffTest : public ::testing::Test {
 protected:
  static TestRouter::Options Off(TestRouter::Options o) {
    o.direct_datagrams = false;
    return o;
  }
  LoopbackNetwork net;
  FakeCluster cluster;
  TestRouter a{Off(Node("node-a", "192.168.0.1", &net, &cluster))};
  TestRouter b{Off(Node("node-b", "192.168.0.2", &net, &cluster))};
  RawPod pa{a, kPodA};
  RawPod pb{b, kPodB};
};

// Without --direct-datagrams UD stays relayed.
TEST_F(DirectPathDatagramsOffTest, UdIsRelayed) {
  ASSERT_EQ(pa.Hello(), 0);
  ASSERT_EQ(pb.Hello(), 0);
  RawQp ua = pa.CreateQp(IBV_QPT_UD);
  RawQp ub = pb.CreateQp(IBV_QPT_UD);
  RawLink l = pa.Connect(ua, kPodB, ub.qpn, true);
  ASSERT_EQ(l.status, 0);
  EXPECT_EQ(l.reply.flags, proto::kConnectRemote);
  EXPECT_EQ(l.fds.size(), 2u);
}

// A target pod whose address cannot be listened on (not this machine's here): its router
// cannot make the connection, and relays the channel instead of failing it.
TEST_F(DirectPathTest, AConnectionThatCannotBeListenedForIsRelayed) {
  RawPod other{b, Ip("10.9.0.1")};
  ASSERT_EQ(other.Hello(), 0);
  Pair p = Connect(pa, kPodA, other, Ip("10.9.0.1"));
  ASSERT_EQ(p.link.status, 0);
  EXPECT_EQ(p.link.reply.flags, proto::kConnectRemote);
  EXPECT_EQ(p.link.fds.size(), 2u);
  EXPECT_EQ(b.Stat("direct_conns"), 0u);
}

// The inode of the test's own network namespace, as an identity names a pod's.
uint64_t OwnNetns() {
  struct stat st {};
  EXPECT_EQ(::stat("/proc/self/ns/net", &st), 0);
  return st.st_ino;
}

// A target pod identified in a namespace (its own process's, here): its router opens the
// namespace once, charged to the pod, and listens inside it. One identified in a namespace
// its process is not in gets no handle: the channel is relayed.
TEST(DirectPathNamespaceTest, TheListenerIsOpenedInTheTargetsNamespace) {
  for (const bool right : {true, false}) {
    LoopbackNetwork net;
    FakeCluster cluster;
    TestRouter a{Node("node-a", "192.168.0.1", &net, &cluster)};
    TestRouter b{Node("node-b", "192.168.0.2", &net, &cluster)};
    RawPod pa{a, kPodA};
    RawPod pb{b, kPodB, right ? OwnNetns() : OwnNetns() + 1};
    ASSERT_EQ(pa.Hello(), 0);
    ASSERT_EQ(pb.Hello(), 0);
    Pair p = Connect(pa, kPodA, pb, kPodB);
    ASSERT_EQ(p.link.status, 0);
    if (!right) {
      EXPECT_EQ(p.link.reply.flags, proto::kConnectRemote);
      continue;
    }
    if (p.link.reply.flags == proto::kConnectRemote && ::geteuid() != 0)
      GTEST_SKIP() << "entering a network namespace needs CAP_SYS_ADMIN";
    ASSERT_EQ(p.link.reply.flags, proto::kConnectDirect | proto::kConnectDirectNew);
    UniqueFd dialler = Dial(kPodA, kPodB, p.link.reply, "x");
    std::optional<RawPod::SetupEvent> e = NextDirect(pb);
    ASSERT_TRUE(e.has_value());
    ASSERT_EQ(e->event.type, proto::EventType::kDirectChannel);
    e = NextDirect(pb);
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->event.type, proto::EventType::kDirectConn);
    // A second connection of the pod uses the same handle.
    RawPod pa2{a, kPodA};
    ASSERT_EQ(pa2.Hello(), 0);
    const Pair q = Connect(pa2, kPodA, pb, kPodB);
    EXPECT_EQ(q.link.reply.flags, proto::kConnectDirect | proto::kConnectDirectNew);
  }
}

// A direct channel holds no descriptor of its pod (a relayed one holds its proxy segment
// and doorbell, two): a pod two descriptors from its quota still connects directly. The
// target's listener is one of its pod's until it accepted.
TEST(DirectPathQuotaTest, ADirectChannelHoldsNoDescriptorOfThePod) {
  for (const bool direct : {true, false}) {
    LoopbackNetwork net;
    FakeCluster cluster;
    // The session's socket, HELLO's five, the QP's segment: 7, and one for the listener.
    TestRouter::Options oa = Node("node-a", "192.168.0.1", &net, &cluster, direct);
    TestRouter::Options ob = Node("node-b", "192.168.0.2", &net, &cluster, direct);
    oa.limits = WithLimits({{Quota::kFds, 8}});
    if (direct) ob.limits = oa.limits;  // (b's relayed naming connect would need two more)
    TestRouter a{oa};
    TestRouter b{ob};
    RawPod pa{a, kPodA};
    RawPod pb{b, kPodB};
    ASSERT_EQ(pa.Hello(), 0);
    ASSERT_EQ(pb.Hello(), 0);
    Pair p = Connect(pa, kPodA, pb, kPodB);
    EXPECT_EQ(p.link.status, direct ? 0 : EMFILE);
    if (!direct) continue;
    EXPECT_EQ(p.link.reply.flags, proto::kConnectDirect | proto::kConnectDirectNew);
    // b's descriptors are all taken while its listener waits: another QP of b is refused.
    EXPECT_EQ(pb.CreateQp(IBV_QPT_RC).status, EMFILE);
    UniqueFd dialler = Dial(kPodA, kPodB, p.link.reply, "");
    ASSERT_TRUE(NextDirect(pb).has_value());  // the channel
    const std::optional<RawPod::SetupEvent> conn = NextDirect(pb);
    ASSERT_TRUE(conn.has_value());
    EXPECT_EQ(conn->event.type, proto::EventType::kDirectConn);
    EXPECT_EQ(pb.CreateQp(IBV_QPT_RC).status, 0) << "the listener's descriptor is back";
  }
}

// A router at 192.168.0.66 holding 127.66.0.1 that answers connects as the test tells it.
class EvilRouter final : public NodeTransport::Handler {
 public:
  EvilRouter(LoopbackNetwork& net, FakeCluster& cluster) {
    EXPECT_EQ(loop_.Init(), 0);
    const cp::Endpoint where{"evil", Ip("192.168.0.66"), 7471};
    transport_ = net.Attach(where);
    std::string error;
    EXPECT_TRUE(transport_->Start(loop_, *this, &error)) << error;
    cluster.Set(kEvilPod, where);
  }
  Verdict OnMessage(LinkId l, const NodeMessage& m) override {
    if (m.type == wire::Type::kConnect) {
      link_ = l;
      chan_ = m.chan;
      std::memcpy(&connect_, m.body, sizeof(connect_));
    }
    if (m.type == wire::Type::kClose) closed_.push_back(m.chan);
    return Verdict::kConsumed;
  }
  void OnDrained(LinkId) override {}
  void OnLinkDown(LinkId, const std::string&) override { down_ = true; }

  // `pod` connects `qp` to a QP of ours; true once its router's kConnect arrived.
  bool Connected(RawPod& pod, const RawQp& qp) {
    link_ = kNoLink;
    proto::ConnectQp m{};
    m.qpn = qp.qpn;
    m.dest_ip = htonl(kEvilPod);
    m.dest_qpn = 0x100;
    pod.SendRaw(&m, sizeof(m));
    return Pump([&] { return link_ != kNoLink; });
  }
  void Answer(const wire::ConnectReply& r) {
    transport_->Send(link_, wire::Type::kConnectReply, chan_, 0, {{&r, sizeof(r)}});
  }
  // A well-formed direct answer to the last connect.
  static wire::ConnectReply Direct(bool fresh) {
    wire::ConnectReply r{0, 0x100, kEvilPod, IBV_QPT_RC};
    r.flags = wire::kReplyDirect | (fresh ? wire::kReplyNewConn : 0);
    r.port = fresh ? 20001 : 0;
    r.seal = static_cast<uint8_t>(SealMode::kEncrypt);
    r.conn = 0xc0ffee;
    r.token = 0x70ce;
    if (fresh) r.secret[0] = 1;
    return r;
  }
  bool ClosedChannel() {
    return Pump([&] { return !closed_.empty() && closed_.back() == chan_; });
  }
  bool down() {
    loop_.RunOnce(10);
    return down_;
  }
  const wire::Connect& connect() const { return connect_; }

  static constexpr uint32_t kEvilPod = 0x7f420001;  // 127.66.0.1

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
  wire::Connect connect_{};
  std::vector<uint32_t> closed_;
  bool down_ = false;
};

TEST_F(DirectPathTest, ADirectRouterAsksWithItsProcesssToken) {
  EvilRouter evil(net, cluster);
  RawQp qp = pa.CreateQp(IBV_QPT_RC);
  ASSERT_TRUE(evil.Connected(pa, qp));
  EXPECT_EQ(evil.connect().flags, wire::kConnectAskDirect);
  EXPECT_NE(evil.connect().token, 0u);
  const uint64_t token = evil.connect().token;
  RawQp again = pa.CreateQp(IBV_QPT_RC);
  ASSERT_TRUE(evil.Connected(pa, again));
  EXPECT_EQ(evil.connect().token, token) << "one token per process";
  RawPod other{a, kPodA};
  ASSERT_EQ(other.Hello(), 0);
  RawQp theirs = other.CreateQp(IBV_QPT_RC);
  ASSERT_TRUE(evil.Connected(other, theirs));
  EXPECT_NE(evil.connect().token, token);
}

// Replies that break the direct fields fail that connect with EPROTO; the peer hears kClose
// for the channel it opened; the link stays up.
TEST_F(DirectPathTest, AMalformedDirectReplyFailsThatConnectOnly) {
  EvilRouter evil(net, cluster);
  struct Case {
    const char* what;
    wire::ConnectReply r;
  };
  std::vector<Case> cases;
  auto with = [](const char* what, bool fresh, auto change) {
    wire::ConnectReply r = EvilRouter::Direct(fresh);
    change(r);
    return Case{what, r};
  };
  cases.push_back(with("unknown seal", true, [](auto& r) { r.seal = 7; }));
  cases.push_back(with("no seal", true, [](auto& r) { r.seal = 0; }));
  cases.push_back(with("new without a port", true, [](auto& r) { r.port = 0; }));
  cases.push_back(with("new without direct", true, [](auto& r) { r.flags = wire::kReplyNewConn; }));
  cases.push_back(with("an unknown flag", true, [](auto& r) { r.flags |= 4; }));
  cases.push_back(with("no connection id", true, [](auto& r) { r.conn = 0; }));
  cases.push_back(with("no token", true, [](auto& r) { r.token = 0; }));
  cases.push_back(with("another pod", true, [](auto& r) { r.peer_ip = kPodB; }));
  for (const Case& c : cases) {
    RawQp qp = pa.CreateQp(IBV_QPT_RC);
    ASSERT_TRUE(evil.Connected(pa, qp)) << c.what;
    evil.Answer(c.r);
    EXPECT_EQ(pa.Receive().status, EPROTO) << c.what;
    EXPECT_TRUE(evil.ClosedChannel()) << c.what;
    EXPECT_FALSE(evil.down()) << c.what;
  }
  // A good one goes through on the same link; then a connection id it already holds is not
  // new, and one it does not hold is not shared.
  RawQp good = pa.CreateQp(IBV_QPT_RC);
  ASSERT_TRUE(evil.Connected(pa, good));
  evil.Answer(EvilRouter::Direct(true));
  const proto::Response ok = pa.Receive();
  EXPECT_EQ(ok.status, 0);
  EXPECT_EQ(ok.u.connect.flags, proto::kConnectDirect | proto::kConnectDirectNew);
  EXPECT_EQ(ok.u.connect.direct_port, 20001);
  RawQp dup = pa.CreateQp(IBV_QPT_RC);
  ASSERT_TRUE(evil.Connected(pa, dup));
  evil.Answer(EvilRouter::Direct(true));
  EXPECT_EQ(pa.Receive().status, EPROTO) << "a connection it holds named new";
  RawQp wrong_token = pa.CreateQp(IBV_QPT_RC);
  ASSERT_TRUE(evil.Connected(pa, wrong_token));
  wire::ConnectReply r = EvilRouter::Direct(false);
  r.token = 0x1234;
  evil.Answer(r);
  EXPECT_EQ(pa.Receive().status, EPROTO) << "its connection with another process";
  RawQp unknown = pa.CreateQp(IBV_QPT_RC);
  ASSERT_TRUE(evil.Connected(pa, unknown));
  r = EvilRouter::Direct(false);
  r.conn = 0xdead;
  evil.Answer(r);
  EXPECT_EQ(pa.Receive().status, ECONNRESET) << "a connection it does not know";
  RawQp shared = pa.CreateQp(IBV_QPT_RC);
  ASSERT_TRUE(evil.Connected(pa, shared));
  evil.Answer(EvilRouter::Direct(false));
  const proto::Response reuse = pa.Receive();
  EXPECT_EQ(reuse.status, 0);
  EXPECT_EQ(reuse.u.connect.flags, proto::kConnectDirect);
  EXPECT_EQ(reuse.u.connect.direct_conn, 0xc0ffeeu);
  EXPECT_FALSE(evil.down());
  // Other links were never in question.
  const Pair p = Connect(pa, kPodA, pb, kPodB);
  EXPECT_EQ(p.link.status, 0);
}

// A router at 192.168.0.66 (holding 127.66.0.1) that dials router b itself and sends what
// the test says, recording the answers.
class EvilInitiator final : public NodeTransport::Handler {
 public:
  EvilInitiator(LoopbackNetwork& net, FakeCluster& cluster, const cp::Endpoint& target) {
    EXPECT_EQ(loop_.Init(), 0);
    const cp::Endpoint where{"evil", Ip("192.168.0.66"), 7471};
    transport_ = net.Attach(where);
    cluster.Set(EvilRouter::kEvilPod, where);
    std::string error;
    EXPECT_TRUE(transport_->Start(loop_, *this, &error)) << error;
    link_ = transport_->Dial(target);
  }
  Verdict OnMessage(LinkId, const NodeMessage& m) override {
    if (m.type == wire::Type::kConnectReply) {
      wire::ConnectReply r;
      std::memcpy(&r, m.body, sizeof(r));
      replies.push_back(r);
    }
    if (m.type == wire::Type::kResp) {
      RecordHeader h;
      const char* payload = nullptr;
      ResponseView v{};
      if (SplitRecord(m.body, m.len, &h, &payload) && DecodeResponse(h, payload, &v))
        answers.push_back(v.resp);
    }
    return Verdict::kConsumed;
  }
  void OnDrained(LinkId) override {}
  void OnLinkDown(LinkId, const std::string&) override { down = true; }

  void Connect(uint32_t chan, const wire::Connect& c) {
    transport_->Send(link_, wire::Type::kConnect, chan, 0, {{&c, sizeof(c)}});
  }
  // One whole SEND of `text` as a record of channel `chan`.
  void SendRecord(uint32_t chan, const std::string& text) {
    ProxyRequest req{};
    req.opcode = IBV_WR_SEND;
    req.seq = 1;
    req.length = static_cast<uint32_t>(text.size());
    req.last = 1;
    RecordHeader h{};
    h.kind = kRecSend;
    h.flags = kRecFirst | kRecLast;
    h.msg_len = req.length;
    h.frag_len = static_cast<uint32_t>(sizeof(req) + text.size());
    h.total = RecordBytes(h.frag_len);
    transport_->Send(link_, wire::Type::kRecord, chan, 0,
                     {{&h, sizeof(h)}, {&req, sizeof(req)}, {text.data(), text.size()}});
  }
  template <typename Pred>
  bool Pump(Pred pred) {
    return WaitFor([&] {
      loop_.RunOnce(1);
      return pred();
    });
  }

  std::vector<wire::ConnectReply> replies;
  std::vector<ProxyResponse> answers;
  bool down = false;

 private:
  EventLoop loop_;
  std::unique_ptr<NodeTransport> transport_;
  LinkId link_ = kNoLink;
};

// The target's router answers a direct ask itself: the connection's fields, its process's
// token; and a record that comes for that channel on the link is answered as for a channel
// it does not know, nothing of it reaching the target.
TEST_F(DirectPathTest, ARecordForADirectChannelIsAnsweredAsForAnUnknownChannel) {
  EvilInitiator evil(net, cluster, b.endpoint());
  RawQp qb = pb.CreateQp(IBV_QPT_RC);
  qb.hdr()->credits.posted.store(1);
  NameOnly(pb, qb, EvilRouter::kEvilPod, 0x100);
  evil.Connect(
      7, {EvilRouter::kEvilPod, 0x100, IBV_QPT_RC, kPodB, qb.qpn, wire::kConnectAskDirect, 0x7070});
  ASSERT_TRUE(evil.Pump([&] { return evil.replies.size() == 1; }));
  const wire::ConnectReply& r = evil.replies[0];
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.flags, wire::kReplyDirect | wire::kReplyNewConn);
  EXPECT_NE(r.port, 0);
  EXPECT_EQ(r.seal, static_cast<uint8_t>(SealMode::kEncrypt));
  EXPECT_NE(r.conn, 0u);
  EXPECT_NE(r.token, 0u);
  EXPECT_FALSE(Zero(r.secret, sizeof(r.secret)));
  EXPECT_EQ(r.peer_qpn, qb.qpn);
  EXPECT_EQ(r.peer_ip, kPodB);
  const std::optional<RawPod::SetupEvent> e = pb.NextSetupEvent();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->event.type, proto::EventType::kDirectChannel);
  EXPECT_EQ(e->event.chan, 7u);
  EXPECT_EQ(e->event.conn, r.conn);
  evil.SendRecord(7, "not here");
  ASSERT_TRUE(evil.Pump([&] { return evil.answers.size() == 1; }));
  EXPECT_EQ(evil.answers[0].status, IBV_WC_RETRY_EXC_ERR);
  RingConsumer in;
  in.Attach(qb.ring(0), qb.ring_bytes);
  RecordHeader h;
  const char* payload = nullptr;
  EXPECT_EQ(in.Peek(&h, &payload), RingStatus::kEmpty);
  EXPECT_FALSE(evil.down);
}

// A router that asks with flags it does not know, without its token, or with a token and no
// ask, is refused.
TEST_F(DirectPathTest, AConnectWithUnknownFlagsOrAStrayTokenIsRefused) {
  EvilInitiator evil(net, cluster, b.endpoint());
  RawQp qb = pb.CreateQp(IBV_QPT_RC);
  NameOnly(pb, qb, EvilRouter::kEvilPod, 0x100);
  const wire::Connect bad[] = {
      {EvilRouter::kEvilPod, 0x100, IBV_QPT_RC, kPodB, qb.qpn, 2, 5},
      {EvilRouter::kEvilPod, 0x100, IBV_QPT_RC, kPodB, qb.qpn, wire::kConnectAskDirect, 0},
      {EvilRouter::kEvilPod, 0x100, IBV_QPT_RC, kPodB, qb.qpn, 0, 5},
  };
  uint32_t chan = 1;
  for (const wire::Connect& c : bad) evil.Connect(chan++, c);
  ASSERT_TRUE(evil.Pump([&] { return evil.replies.size() == 3; }));
  for (const wire::ConnectReply& r : evil.replies) {
    EXPECT_EQ(r.status, EPROTO);
    EXPECT_EQ(r.flags, 0u);
  }
  EXPECT_FALSE(pb.NextSetupEvent(50).has_value());
  EXPECT_FALSE(evil.down);
}

}  // namespace
}  // namespace ff::router::test
