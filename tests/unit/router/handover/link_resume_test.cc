// Channels to another node across its router's replacement (router/src/nodes/link_resume.h,
// docs/handover.md "Channels to other nodes"), as the router that stays sees it: a real
// router (node-b, --cross-node-path=direct) with a pod, and a peer router the test plays
// (node-p) whose links it breaks and whose successor it attaches at the same endpoint.
// Announced links park their direct channels (the pod hears nothing), the successor
// resumes them, what it does not list ends, another node cannot resume them, an
// unannounced loss fails them at once and a successor that never comes fails them at the
// deadline.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "harness.h"

namespace ff::router::test {
namespace {

const uint32_t kPodB = Ip("127.2.0.1");
const uint32_t kPeerPod = Ip("127.77.0.1");
constexpr uint32_t kPeerQpn = 0x4242;
constexpr uint64_t kGraceNs = 400'000'000;

// A router of node `node` at 192.168.0.77 (the peer pod's node), driven by the test: it
// connects to pods of other routers, says it is being replaced, resumes, and records what
// comes back.
class PeerRouter final : public NodeTransport::Handler {
 public:
  PeerRouter(LoopbackNetwork& net, const std::string& node) {
    EXPECT_EQ(loop_.Init(), 0);
    transport_ = net.Attach({node, Ip("192.168.0.77"), 7471});
    std::string error;
    EXPECT_TRUE(transport_->Start(loop_, *this, &error)) << error;
  }
  Verdict OnMessage(LinkId l, const NodeMessage& m) override {
    if (m.type == wire::Type::kConnectReply) std::memcpy(&reply_, m.body, sizeof(reply_));
    if (m.type == wire::Type::kConnect) {
      link_ = l;
      chan_ = m.chan;
    }
    if (m.type == wire::Type::kClose) closed_ = true;
    if (m.type == wire::Type::kResumed || m.type == wire::Type::kResume) {
      std::vector<uint32_t> chans(m.len / 4);
      if (!chans.empty()) std::memcpy(chans.data(), m.body, m.len);
      (m.type == wire::Type::kResumed ? resumed_ : resume_) = chans;
      (m.type == wire::Type::kResumed ? got_resumed_ : got_resume_) = true;
      resume_link_ = l;
    }
    return Verdict::kConsumed;
  }
  void OnDrained(LinkId) override {}
  void OnLinkDown(LinkId, const std::string&) override {}

  // Opens channel `chan` from QP kPeerQpn of the peer pod to QP `qpn` of the pod at `ip` on
  // `to`, asking for a direct one; true once answered (its answer in reply()).
  bool ConnectTo(const TestRouter& to, uint32_t ip, uint32_t qpn, uint32_t chan) {
    link_ = transport_->Dial(to.endpoint());
    const wire::Connect c{kPeerPod, kPeerQpn, IBV_QPT_RC, ip, qpn, wire::kConnectAskDirect, 0x77};
    reply_.status = -1;
    transport_->Send(link_, wire::Type::kConnect, chan, 0, {{&c, sizeof(c)}});
    return Pump([&] { return reply_.status != -1; });
  }
  void Send(wire::Type type, uint32_t chan, const std::vector<uint32_t>& body = {}) {
    transport_->Send(link_, type, chan, 0, {{body.data(), body.size() * sizeof(uint32_t)}});
  }
  // Resumes `chans` on a link dialled to `to`: true once kResumed came (in resumed()).
  bool Resume(const TestRouter& to, const std::vector<uint32_t>& chans) {
    link_ = transport_->Dial(to.endpoint());
    Send(wire::Type::kResume, 0, chans);
    return Pump([&] { return got_resumed_; });
  }
  // The router the test pods live on dialled here and resumed: true once kResume came,
  // answered with `missing`.
  bool AnswerResume(const std::vector<uint32_t>& missing, int timeout_ms = 3000) {
    if (!Pump([&] { return got_resume_; }, timeout_ms)) return false;
    link_ = resume_link_;
    Send(wire::Type::kResumed, 0, missing);
    loop_.RunOnce(10);
    return true;
  }
  // A router dialled here and opened a channel: true once its kConnect came; then the
  // answer, a direct channel on a new connection of the two processes.
  bool Connected() {
    return Pump([&] { return chan_ != 0; });
  }
  void AnswerDirect() {
    wire::ConnectReply r{0, kPeerQpn, kPeerPod, IBV_QPT_RC};
    r.flags = wire::kReplyDirect | wire::kReplyNewConn;
    r.port = 20001;
    r.seal = static_cast<uint8_t>(SealMode::kEncrypt);
    r.conn = 0xc0ffee00 + chan_;  // a new connection each time
    r.token = 0x77;
    r.secret[0] = 1;
    transport_->Send(link_, wire::Type::kConnectReply, chan_, 0, {{&r, sizeof(r)}});
    loop_.RunOnce(10);
  }
  uint32_t chan() const { return chan_; }
  bool closed() {
    loop_.RunOnce(10);
    return closed_;
  }
  void Idle(int ms) {
    for (int i = 0; i < ms / 10; ++i) loop_.RunOnce(10);
  }
  const wire::ConnectReply& reply() const { return reply_; }
  const std::vector<uint32_t>& resumed() const { return resumed_; }
  const std::vector<uint32_t>& resume() const { return resume_; }
  LinkId link() const { return link_; }
  void set_link(LinkId l) { link_ = l; }

 private:
  template <typename Pred>
  bool Pump(Pred pred, int timeout_ms = 3000) {
    return WaitFor(
        [&] {
          loop_.RunOnce(1);
          return pred();
        },
        std::chrono::milliseconds(timeout_ms));
  }
  EventLoop loop_;
  std::unique_ptr<NodeTransport> transport_;
  LinkId link_ = kNoLink;
  LinkId resume_link_ = kNoLink;
  uint32_t chan_ = 0;
  bool closed_ = false;
  wire::ConnectReply reply_{};
  std::vector<uint32_t> resumed_, resume_;
  bool got_resumed_ = false, got_resume_ = false;
};

class LinkResumeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(pb.Hello(), 0);
    cluster.Set(kPeerPod, {"node-p", Ip("192.168.0.77"), 7471});
    qb = pb.CreateQp(IBV_QPT_RC);
    proto::NameQp m{};  // names its peer without linking (the peer's router links)
    m.qpn = qb.qpn;
    m.dest_ip = htonl(kPeerPod);
    m.dest_qpn = kPeerQpn;
    ASSERT_EQ(pb.Call(m).status, 0);
  }
  static TestRouter::Options Node(LoopbackNetwork* net, FakeCluster* cluster) {
    TestRouter::Options o;
    o.node = "node-b";
    o.host_ip = Ip("192.168.0.2");
    o.network = net;
    o.cluster = cluster;
    o.overlay = "127.0.0.0/8";
    o.direct = true;
    o.resume_grace_ns = kGraceNs;
    return o;
  }
  // The peer opens channel 7 to qb, a direct one; pb hears of it.
  void OpenChannel(PeerRouter& peer) {
    ASSERT_TRUE(peer.ConnectTo(b, kPodB, qb.qpn, 7));
    ASSERT_EQ(peer.reply().status, 0);
    ASSERT_NE(peer.reply().flags & wire::kReplyDirect, 0u);
    std::optional<RawPod::SetupEvent> e = pb.NextSetupEvent();
    while (e && e->event.type != proto::EventType::kDirectChannel) e = pb.NextSetupEvent();
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->event.chan, 7u);
  }
  // The peer says it is being replaced, and goes: its links break.
  static void Replaced(std::unique_ptr<PeerRouter> old) {
    old->Send(wire::Type::kHandingOver, 0);
    old->Idle(50);
  }
  void ExpectEnded() {
    std::optional<proto::Event> e = pb.NextEvent();
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->type, proto::EventType::kDirectChannelGone);
    e = pb.NextEvent();
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->type, proto::EventType::kPeerGone);
    EXPECT_EQ(e->qpn, qb.qpn);
  }

  LoopbackNetwork net;
  FakeCluster cluster;
  TestRouter b{Node(&net, &cluster)};
  RawPod pb{b, kPodB};
  RawQp qb;
};

TEST_F(LinkResumeTest, AReplacedRoutersChannelsWaitForItsSuccessorWhichResumesThem) {
  auto old = std::make_unique<PeerRouter>(net, "node-p");
  OpenChannel(*old);
  Replaced(std::move(old));  // its links break
  EXPECT_FALSE(pb.NextEvent(200).has_value()) << "a parked channel ends nothing";
  PeerRouter successor(net, "node-p");
  ASSERT_TRUE(successor.Resume(b, {7, 99}));
  EXPECT_EQ(successor.resumed(), std::vector<uint32_t>{99}) << "99 was never a channel";
  EXPECT_FALSE(pb.NextEvent(kGraceNs / 1'000'000 + 200).has_value()) << "resumed: no deadline";
  successor.Send(wire::Type::kClose, 7);  // the initiator's QP goes: on the resumed link
  const std::optional<proto::Event> e = pb.NextEvent();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->type, proto::EventType::kDirectChannelGone);
}

TEST_F(LinkResumeTest, AChannelTheSuccessorDoesNotListEnds) {
  auto old = std::make_unique<PeerRouter>(net, "node-p");
  OpenChannel(*old);
  Replaced(std::move(old));
  PeerRouter successor(net, "node-p");
  ASSERT_TRUE(successor.Resume(b, {}));  // its QP went while the link was down
  EXPECT_TRUE(successor.resumed().empty());
  ExpectEnded();
}

// Only the node itself resumes its channels: another router's kResume, on its own links,
// gets them named missing and leaves them parked for the node.
TEST_F(LinkResumeTest, AnotherNodeCannotResumeAReplacedRoutersChannels) {
  auto old = std::make_unique<PeerRouter>(net, "node-p");
  OpenChannel(*old);
  Replaced(std::move(old));
  {
    PeerRouter thief(net, "node-q");
    ASSERT_TRUE(thief.Resume(b, {7}));
    EXPECT_EQ(thief.resumed(), std::vector<uint32_t>{7});
    thief.Send(wire::Type::kClose, 7);
    thief.Idle(50);
  }
  EXPECT_FALSE(pb.NextEvent(100).has_value()) << "the thief ended nothing";
  PeerRouter successor(net, "node-p");
  ASSERT_TRUE(successor.Resume(b, {7}));
  EXPECT_TRUE(successor.resumed().empty()) << "still the node's to resume";
}

TEST_F(LinkResumeTest, ALinkLostWithoutAnAnnouncementFailsItsChannelsAtOnce) {
  auto old = std::make_unique<PeerRouter>(net, "node-p");
  OpenChannel(*old);
  old.reset();
  ExpectEnded();
}

TEST_F(LinkResumeTest, ChannelsNobodyResumesFailAtTheDeadline) {
  auto old = std::make_unique<PeerRouter>(net, "node-p");
  OpenChannel(*old);
  Replaced(std::move(old));
  EXPECT_FALSE(pb.NextEvent(kGraceNs / 2'000'000).has_value());
  ExpectEnded();
  PeerRouter late(net, "node-p");
  ASSERT_TRUE(late.Resume(b, {7}));
  EXPECT_EQ(late.resumed(), std::vector<uint32_t>{7}) << "too late";
}

// The other direction: pb's QP initiated the channel. Its router dials the replaced node
// again and resumes; a channel the successor names missing fails the QP, a resumed one
// carries the peer's kPeerGone as before.
TEST_F(LinkResumeTest, ChannelsThisRouterInitiatedAreResumedByDiallingTheSuccessor) {
  for (bool gone : {false, true}) {
    SCOPED_TRACE(gone ? "named missing" : "resumed");
    auto old = std::make_unique<PeerRouter>(net, "node-p");
    RawQp qa = pb.CreateQp(IBV_QPT_RC);
    proto::ConnectQp m{};
    m.qpn = qa.qpn;
    m.dest_ip = htonl(kPeerPod);
    m.dest_qpn = kPeerQpn;
    pb.SendRaw(&m, sizeof(m));
    ASSERT_TRUE(old->Connected());
    const uint32_t chan = old->chan();
    old->AnswerDirect();
    ASSERT_EQ(pb.Receive().status, 0);
    Replaced(std::move(old));
    EXPECT_FALSE(pb.NextEvent(150).has_value()) << "parked";
    auto successor = std::make_unique<PeerRouter>(net, "node-p");
    ASSERT_TRUE(
        successor->AnswerResume(gone ? std::vector<uint32_t>{chan} : std::vector<uint32_t>{}));
    EXPECT_EQ(successor->resume(), std::vector<uint32_t>{chan});
    if (!gone) {
      EXPECT_FALSE(pb.NextEvent(kGraceNs / 1'000'000 + 200).has_value()) << "resumed";
      successor->Send(wire::Type::kPeerGone, chan);  // the target QP goes: on the resumed link
    }
    const std::optional<proto::Event> e = pb.NextEvent();
    ASSERT_TRUE(e.has_value());
    EXPECT_TRUE(e->type == proto::EventType::kPeerGone || e->type == proto::EventType::kPeerClosed);
    EXPECT_EQ(e->qpn, qa.qpn);
    // What the end of the successor's links tells the QP once more (dead already).
    successor.reset();
    while (pb.NextEvent(100)) {
    }
  }
}

}  // namespace
}  // namespace ff::router::test
