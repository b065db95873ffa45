// The TCP node transport between two ends on 127.0.0.1 in one process: framing and order,
// held messages, congestion and its relief, malformed frames and silent peers.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "link_test_util.h"

namespace ff::router::test {
namespace {

TEST(TcpTransport, FramesArriveWholeAndInOrder) {
  End a("node-a"), b("node-b");
  const LinkId l = a.transport.Dial(b.endpoint());
  ASSERT_NE(l, kNoLink);
  EXPECT_TRUE(a.transport.Dialled(l));
  std::vector<std::string> sent;
  for (uint32_t i = 0; i < 300; ++i) {
    // Small frames are batched; large ones take the direct path.
    sent.push_back(RespBody((i * 7919) % (kMaxFragment + 1), static_cast<char>('a' + i % 26)));
    a.transport.Send(l, wire::Type::kResp, i, 0, {{sent.back().data(), sent.back().size()}});
  }
  ASSERT_TRUE(Pump({&a, &b}, [&] { return b.recorder.got.size() == sent.size(); }));
  for (uint32_t i = 0; i < sent.size(); ++i) {
    EXPECT_EQ(b.recorder.got[i].chan, i);
    EXPECT_EQ(b.recorder.got[i].body, sent[i]) << i;
  }
  const LinkId in = b.recorder.got[0].link;
  EXPECT_FALSE(b.transport.Dialled(in));
  EXPECT_EQ(b.transport.PeerNode(in), "node-a");  // from the hello frame
  EXPECT_EQ(a.transport.Dial(b.endpoint()), l);   // one link per peer
}

// What the router's metrics read of each peer node: links up, made and lost, messages and
// their bytes both ways, kept after the link is gone.
TEST(TcpTransport, PeerTotalsCountLinksAndMessagesPastTheirLinks) {
  End a("node-a");
  auto b = std::make_unique<End>("node-b");
  const LinkId l = a.transport.Dial(b->endpoint());
  const std::string body = RespBody(1000, 'p');
  for (uint32_t i = 0; i < 10; ++i)
    a.transport.Send(l, wire::Type::kResp, i, 0, {{body.data(), body.size()}});
  ASSERT_TRUE(Pump({&a, b.get()}, [&] { return b->recorder.got.size() == 10; }));
  std::vector<PeerView> seen = a.transport.Peers();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].peer, "node-b");
  EXPECT_EQ(seen[0].links_up, 1u);
  EXPECT_EQ(seen[0].connects, 1u);
  EXPECT_EQ(seen[0].sent_messages, 10u);
  EXPECT_EQ(seen[0].sent_bytes, 10u * body.size());
  seen = b->transport.Peers();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].peer, "node-a");
  EXPECT_EQ(seen[0].received_messages, 10u);
  EXPECT_EQ(seen[0].received_bytes, 10u * body.size());
  EXPECT_EQ(a.transport.Links().size(), 1u);
  EXPECT_STREQ(a.transport.Links()[0].state, "ready");
  b.reset();  // node-b's router goes
  ASSERT_TRUE(Pump({&a}, [&] { return a.transport.LinkCount() == 0; }));
  seen = a.transport.Peers();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].links_up, 0u);
  EXPECT_EQ(seen[0].losses, 1u);
  EXPECT_EQ(seen[0].sent_messages, 10u);
}

TEST(TcpTransport, AHeldMessageIsOfferedAgainAfterResume) {
  End a("node-a"), b("node-b");
  const LinkId l = a.transport.Dial(b.endpoint());
  b.recorder.hold = true;
  for (uint32_t i = 0; i < 3; ++i) a.transport.Send(l, wire::Type::kClose, i, 0, {});
  ASSERT_TRUE(Pump({&a, &b}, [&] { return b.recorder.offers_held > 0; }));
  Pump(
      {&a, &b}, [] { return false; }, 100);
  EXPECT_EQ(b.recorder.offers_held, 1);  // nothing behind the held message was offered
  EXPECT_TRUE(b.recorder.got.empty());
  b.recorder.hold = false;
  b.transport.Resume(b.recorder.held_link);
  ASSERT_TRUE(Pump({&a, &b}, [&] { return b.recorder.got.size() == 3; }));
  for (uint32_t i = 0; i < 3; ++i) EXPECT_EQ(b.recorder.got[i].chan, i);
}

TEST(TcpTransport, CongestionIsReportedAndClearsWhenThePeerDrains) {
  End a("node-a"), b("node-b");
  const LinkId l = a.transport.Dial(b.endpoint());
  a.transport.Send(l, wire::Type::kClose, 0, 0, {});
  ASSERT_TRUE(Pump({&a, &b}, [&] { return !b.recorder.got.empty(); }));
  b.recorder.hold = true;  // B stops taking messages, so TCP stops taking A's bytes
  const std::string body = RespBody(kMaxFragment, 'x');
  int sent = 0;
  while (!a.transport.Congested(l) && sent < 4000) {
    a.transport.Send(l, wire::Type::kResp, 1, 0, {{body.data(), body.size()}});
    ++sent;
    a.loop.RunOnce(0);
    b.loop.RunOnce(0);
  }
  ASSERT_TRUE(a.transport.Congested(l)) << "sent " << sent << " frames without congestion";
  EXPECT_TRUE(a.recorder.drained.empty());
  b.recorder.hold = false;
  b.transport.Resume(b.recorder.got[0].link);
  ASSERT_TRUE(Pump({&a, &b}, [&] { return !a.recorder.drained.empty(); }));
  EXPECT_EQ(a.recorder.drained[0], l);
  EXPECT_FALSE(a.transport.Congested(l));
  ASSERT_TRUE(Pump({&a, &b}, [&] { return b.recorder.got.size() == 1u + sent; }));
}

TEST(TcpTransport, AMalformedFrameClosesTheLink) {
  End b("node-b");
  const std::vector<wire::FrameHeader> bad = {
      {0, static_cast<wire::Type>(99), 0, 0, 0},           // unknown type
      {kMaxFrame + 1, wire::Type::kResp, 0, 0, 0},         // oversized
      {3, wire::Type::kClose, 0, 0, 0},                    // a close carries no body
      {sizeof(wire::Hello), wire::Type::kHello, 0, 0, 0},  // a hello with a wrong magic
  };
  for (uint64_t i = 0; i < bad.size(); ++i) {
    UniqueFd c = RawClient(b.transport.port());
    std::string bytes(reinterpret_cast<const char*>(&bad[i]), sizeof(bad[i]));
    bytes.resize(sizeof(bad[i]) + (bad[i].type == wire::Type::kHello ? sizeof(wire::Hello) : 3));
    ASSERT_EQ(::send(c.get(), bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size()));
    ASSERT_TRUE(Pump({&b}, [&] { return b.transport.gate().refused() == i + 1; })) << i;
    EXPECT_EQ(b.transport.gate().last_refusal(),
              bad[i].type == wire::Type::kHello
                  ? "peer router speaks wire version 0, this one " + std::to_string(wire::kVersion)
                  : "malformed frame from peer router");
  }
  // Counted by reason (metrics): three malformed frames, one hello of another version.
  EXPECT_EQ(b.transport.gate().refusals().count(GateRefusal::kMalformed), 3u);
  EXPECT_EQ(b.transport.gate().refusals().count(GateRefusal::kVersion), 1u);
  std::map<std::string, uint64_t> port;
  for (const auto& [why, n] : b.transport.PortRefusals()) port[why] = n;
  EXPECT_EQ(port.size(), kGateRefusals) << "every reason has its series";
  EXPECT_EQ(port["malformed"], 3u);
  EXPECT_EQ(port["version"], 1u);
  EXPECT_EQ(port["tls"], 0u);
}

// Before its hello a connection waits in the gate, bounded by kDialTimeoutNs; a router that
// said hello and then went silent is declared dead by the link's own timeout.
TEST(TcpTransport, ASilentPeerIsDeclaredDead) {
  End b("node-b", 100);  // accepted links wait 3 x 100 ms
  UniqueFd c = RawClient(b.transport.port());
  wire::Hello hello{wire::kMagic, wire::kVersion, "node-a"};
  const wire::FrameHeader h{sizeof(hello), wire::Type::kHello, 0, 0, 0};
  std::string bytes(reinterpret_cast<const char*>(&h), sizeof(h));
  bytes.append(reinterpret_cast<const char*>(&hello), sizeof(hello));
  ASSERT_EQ(::send(c.get(), bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size()));
  ASSERT_TRUE(Pump({&b}, [&] { return b.transport.LinkCount() == 1; }));
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(Pump(
      {&b}, [&] { return !b.recorder.down.empty(); }, 3000));
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(250));
  EXPECT_EQ(b.recorder.last_why, "peer router silent for too long");
}

// One-way traffic (UD across nodes answers nothing): the dialling end keeps sending, so it
// must still ping to hear from its peer, or it closes a healthy link as silent.
TEST(TcpTransport, ALinkThatOnlySendsStaysUp) {
  End a("node-a", 300), b("node-b", 300);
  const LinkId l = a.transport.Dial(b.endpoint());
  ASSERT_NE(l, kNoLink);
  for (uint32_t i = 0; i < 100; ++i) {  // 1 s, more than three timeouts
    a.transport.Send(l, wire::Type::kClose, i, 0, {});
    Pump(
        {&a, &b}, [] { return false; }, 10);
  }
  EXPECT_TRUE(a.recorder.down.empty()) << a.recorder.last_why;
  EXPECT_TRUE(b.recorder.down.empty()) << b.recorder.last_why;
  EXPECT_EQ(b.recorder.got.size(), 100u);
}

TEST(TcpTransport, ADialToNobodyFails) {
  End a("node-a");
  UniqueFd closed(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(kLoopback);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(::bind(closed.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::getsockname(closed.get(), reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const cp::Endpoint nobody{"nobody", kLoopback, ntohs(addr.sin_port)};  // bound, not listening
  const LinkId l = a.transport.Dial(nobody);
  if (l != kNoLink) {
    ASSERT_TRUE(Pump({&a}, [&] { return !a.recorder.down.empty(); }));
    EXPECT_EQ(a.recorder.down[0], l);
  }
}

}  // namespace
}  // namespace ff::router::test
