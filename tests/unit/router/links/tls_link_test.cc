// Node links with TLS between transport ends on 127.0.0.1, certificates made by
// scripts/ff-certs.sh: what crosses an authenticated link, and every peer that must be
// refused before anything it sends is acted on (plaintext, another CA, another node's
// certificate, a hello that names another node, connections that never authenticate).
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>

#include "link_test_util.h"
#include "nodes/tls.h"

namespace ff::router::test {
namespace {

namespace fs = std::filesystem;

class TlsLink : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char tmpl[] = "/tmp/ff-tls-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = new std::string(tmpl);
    const std::string script = FF_CERTS_SCRIPT;
    const std::string quiet = " >/dev/null 2>&1";
    for (const std::string& cmd :
         {script + " " + *dir_ + " ca", script + " " + *dir_ + " node node-a node-b node-c",
          script + " " + *dir_ + "/other ca", script + " " + *dir_ + "/other node node-a"}) {
      ASSERT_EQ(std::system((cmd + quiet).c_str()), 0) << cmd;
    }
  }
  static void TearDownTestSuite() {
    fs::remove_all(*dir_);
    delete dir_;
  }
  void SetUp() override { signal(SIGPIPE, SIG_IGN); }  // as ffrouter does

  // The context of `node`, signed by the cluster's CA (or the other CA's, `sub` "other").
  static std::shared_ptr<const TlsContext> Context(const std::string& node,
                                                   const std::string& sub = "") {
    const std::string d = sub.empty() ? *dir_ : *dir_ + "/" + sub;
    std::string error;
    auto ctx = TlsContext::Load({d + "/ca.crt", d + "/" + node + ".crt", d + "/" + node + ".key"},
                                node, &error);
    EXPECT_NE(ctx, nullptr) << error;
    return ctx;
  }
  static std::string Dir() { return *dir_; }

  // Sends a few frames on `l` and pumps until `to` has them or `l` went down.
  static void SendSome(End& from, LinkId l) {
    const std::string body = RespBody(100, 'r');
    for (uint32_t i = 0; i < 3; ++i)
      from.transport.Send(l, wire::Type::kResp, i, 0, {{body.data(), body.size()}});
  }

 private:
  static std::string* dir_;
};
std::string* TlsLink::dir_ = nullptr;

TEST_F(TlsLink, FramesCrossAnAuthenticatedLinkWholeAndInOrder) {
  End a("node-a", 2000, Context("node-a")), b("node-b", 2000, Context("node-b"));
  const LinkId l = a.transport.Dial(b.endpoint());
  ASSERT_NE(l, kNoLink);
  std::vector<std::string> sent;
  for (uint32_t i = 0; i < 200; ++i) {
    sent.push_back(RespBody((i * 7919) % (kMaxFragment + 1), static_cast<char>('a' + i % 26)));
    a.transport.Send(l, wire::Type::kResp, i, 0, {{sent.back().data(), sent.back().size()}});
  }
  ASSERT_TRUE(Pump({&a, &b}, [&] { return b.recorder.got.size() == sent.size(); }));
  for (uint32_t i = 0; i < sent.size(); ++i) EXPECT_EQ(b.recorder.got[i].body, sent[i]) << i;
  const LinkId in = b.recorder.got[0].link;
  EXPECT_EQ(b.transport.PeerNode(in), "node-a");
  EXPECT_EQ(a.transport.PeerNode(l), "node-b");
  // And back, on the same link.
  a.recorder.got.clear();
  b.transport.Send(in, wire::Type::kPeerGone, 7, 1, {});
  ASSERT_TRUE(Pump({&a, &b}, [&] { return a.recorder.got.size() == 1; }));
  EXPECT_EQ(a.recorder.got[0].chan, 7u);
}

// A router that stops ends its TLS links in order: its peer reads the end of the link, not
// a stream cut short ("Protocol error", which read as an attack or a bug in the logs).
TEST_F(TlsLink, ARouterThatStopsEndsItsLinksInOrder) {
  End b("node-b", 2000, Context("node-b"));
  auto a = std::make_unique<End>("node-a", 2000, Context("node-a"));
  const LinkId l = a->transport.Dial(b.endpoint());
  ASSERT_NE(l, kNoLink);
  SendSome(*a, l);
  ASSERT_TRUE(Pump({a.get(), &b}, [&] { return b.recorder.got.size() == 3; }));
  a.reset();
  ASSERT_TRUE(Pump({&b}, [&] { return !b.recorder.down.empty(); }));
  EXPECT_EQ(b.recorder.last_why, "peer router closed the connection");
}

// An unauthenticated process speaking the plaintext wire protocol: its hello, connect
// (with a forged source), SEND record and READ request never reach the handler.
TEST_F(TlsLink, APlaintextPeerIsRefusedBeforeAnyFrameIsActedOn) {
  End b("node-b", 2000, Context("node-b"));
  UniqueFd c = RawClient(b.transport.port());
  std::string bytes;
  const auto frame = [&](wire::Type type, const void* body, uint32_t len) {
    const wire::FrameHeader h{len, type, 0, 1, 0};
    bytes.append(reinterpret_cast<const char*>(&h), sizeof(h));
    bytes.append(static_cast<const char*>(body), len);
  };
  wire::Hello hello{wire::kMagic, wire::kVersion, "node-a"};
  frame(wire::Type::kHello, &hello, sizeof(hello));
  const wire::Connect connect{0x0a2a2a2a, 0xbadbad, 2, 0x0a020001, 0x101, 0};
  frame(wire::Type::kConnect, &connect, sizeof(connect));
  ASSERT_EQ(::send(c.get(), bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size()));
  ASSERT_TRUE(Pump({&b}, [&] { return b.transport.gate().refused() > 0; }));
  EXPECT_TRUE(b.recorder.got.empty());
  EXPECT_EQ(b.transport.LinkCount(), 0u);
  EXPECT_NE(b.transport.gate().last_refusal().find("TLS handshake failed"), std::string::npos)
      << b.transport.gate().last_refusal();
  EXPECT_EQ(b.transport.gate().refusals().count(GateRefusal::kTls), 1u);
  char byte;
  EXPECT_LE(::recv(c.get(), &byte, 1, 0), 0);  // closed
}

TEST_F(TlsLink, ARouterHoldingAnotherNodesCertificateIsRefusedByTheDialler) {
  End a("node-a", 2000, Context("node-a")), c("node-c", 2000, Context("node-c"));
  // The control plane says node-b listens where node-c's router does.
  const cp::Endpoint wrong{"node-b", kLoopback, c.transport.port()};
  const LinkId l = a.transport.Dial(wrong);
  ASSERT_NE(l, kNoLink);
  SendSome(a, l);
  ASSERT_TRUE(Pump({&a, &c}, [&] { return !a.recorder.down.empty(); }));
  EXPECT_NE(a.recorder.last_why.find("not of node node-b"), std::string::npos)
      << a.recorder.last_why;
  Pump(
      {&a, &c}, [] { return false; }, 100);
  EXPECT_TRUE(c.recorder.got.empty());
}

TEST_F(TlsLink, ARouterWhoseHelloNamesAnotherNodeThanItsCertificateIsRefused) {
  End b("node-b", 2000, Context("node-b"));
  End evil("node-a", 2000, Context("node-c"));  // says node-a, holds node-c's certificate
  const LinkId l = evil.transport.Dial(b.endpoint());
  ASSERT_NE(l, kNoLink);
  SendSome(evil, l);
  ASSERT_TRUE(Pump({&evil, &b}, [&] { return b.transport.gate().refused() > 0; }));
  EXPECT_NE(
      b.transport.gate().last_refusal().find("says it is node 'node-a' but its certificate is"),
      std::string::npos)
      << b.transport.gate().last_refusal();
  EXPECT_EQ(b.transport.gate().refusals().count(GateRefusal::kIdentity), 1u);
  EXPECT_TRUE(b.recorder.got.empty());
}

TEST_F(TlsLink, ACertificateFromAnotherCaIsRefusedByBothEnds) {
  End b("node-b", 2000, Context("node-b"));
  End stranger("node-a", 2000, Context("node-a", "other"));
  const LinkId l = stranger.transport.Dial(b.endpoint());
  ASSERT_NE(l, kNoLink);
  SendSome(stranger, l);
  ASSERT_TRUE(Pump({&stranger, &b}, [&] {
    return b.transport.gate().refused() > 0 && !stranger.recorder.down.empty();
  }));
  EXPECT_TRUE(b.recorder.got.empty());
  EXPECT_NE(stranger.recorder.last_why.find("certificate"), std::string::npos)
      << stranger.recorder.last_why;
}

// Whether the router closed connection `fd` (it reads the end of the stream).
bool ClosedByRouter(const UniqueFd& fd) {
  char byte;
  return ::recv(fd.get(), &byte, 1, MSG_DONTWAIT) == 0;
}

// Anyone can open connections to the port: those that never authenticate are bounded per
// address, and the oldest of an address at its bound is closed for its newest.
TEST_F(TlsLink, ConnectionsThatNeverAuthenticateAreBoundedPerAddress) {
  End b("node-b", 2000, Context("node-b"));
  constexpr uint32_t kFlooder = kLoopback + 1;  // 127.0.0.2
  std::vector<UniqueFd> flood;
  for (size_t i = 0; i < kMaxPendingNodeLinksPerSource + 3; ++i) {
    flood.push_back(ConnectingClient(b.transport.port(), kFlooder));
    ASSERT_TRUE(Pump({&b}, [&] {
      return b.transport.gate().waiting() >= std::min(i + 1, kMaxPendingNodeLinksPerSource);
    }));
  }
  // The gate closes the oldest before it counts the newest in (its own thread): a moment
  // after flood[2] closes it still counts one fewer.
  ASSERT_TRUE(Pump({&b},
                   [&] {
                     return ClosedByRouter(flood[0]) && ClosedByRouter(flood[1]) &&
                            ClosedByRouter(flood[2]) &&
                            b.transport.gate().waiting() == kMaxPendingNodeLinksPerSource;
                   }))
      << b.transport.gate().waiting() << " waiting";
  for (size_t i = 3; i < flood.size(); ++i) EXPECT_FALSE(ClosedByRouter(flood[i])) << i;
}

// Across addresses the total is bounded too: at the bound, the oldest connection of the
// address that holds the most makes room for a newcomer from another address.
TEST_F(TlsLink, AtTheTotalBoundTheBusiestAddressGivesWay) {
  End b("node-b", 2000, Context("node-b"));
  constexpr size_t kAddresses = kMaxPendingNodeLinks / kMaxPendingNodeLinksPerSource;
  const auto from = [](size_t a) { return kLoopback + 0x100 + static_cast<uint32_t>(a); };
  std::vector<UniqueFd> flood;
  const auto open = [&](uint32_t address) {
    flood.push_back(RawClient(b.transport.port(), address));
    return Pump({&b}, [&] { return b.transport.gate().waiting() == flood.size(); });
  };
  // Address 0 holds one connection fewer than its bound, every other one its bound, and one
  // more address one connection: the total bound is reached.
  for (size_t a = 0; a < kAddresses; ++a) {
    const size_t n = a == 0 ? kMaxPendingNodeLinksPerSource - 1 : kMaxPendingNodeLinksPerSource;
    for (size_t i = 0; i < n; ++i) ASSERT_TRUE(open(from(a)));
  }
  ASSERT_TRUE(open(from(kAddresses)));
  ASSERT_EQ(b.transport.gate().waiting(), kMaxPendingNodeLinks);
  // Address 0 again: address 1's first connection (the oldest of the busiest) gives way.
  const size_t victim = kMaxPendingNodeLinksPerSource - 1;
  UniqueFd last = RawClient(b.transport.port(), from(0));
  ASSERT_TRUE(Pump({&b},
                   [&] {
                     return ClosedByRouter(flood[victim]) &&
                            b.transport.gate().waiting() == kMaxPendingNodeLinks;
                   }))
      << b.transport.gate().waiting() << " waiting";
  for (size_t i = 0; i < flood.size(); ++i) {
    if (i == victim) continue;
    EXPECT_FALSE(ClosedByRouter(flood[i])) << i;
  }
  EXPECT_FALSE(ClosedByRouter(last));
}

// The attack of issue 37 (6): connections that reconnect as soon as they are closed, from
// many addresses, beyond every bound, half of them from the dialling router's own address (a
// process on its node). A router dialling in the middle of it links, and at once, not after
// the flood's connections time out.
TEST_F(TlsLink, ARouterLinksThroughAFloodOfConnectionsThatNeverAuthenticate) {
  End a("node-a", 2000, Context("node-a")), b("node-b", 2000, Context("node-b"));
  constexpr size_t kFlood = 2 * kMaxPendingNodeLinks;
  std::vector<UniqueFd> flood;
  const auto from = [](size_t i) {
    return i % 2 == 0 ? kLoopback : kLoopback + 0x200 + static_cast<uint32_t>(i % 32);
  };
  for (size_t i = 0; i < kFlood; ++i)
    flood.push_back(ConnectingClient(b.transport.port(), from(i)));
  ASSERT_TRUE(Pump({&b}, [&] { return b.transport.gate().waiting() == kMaxPendingNodeLinks; }));
  size_t reopened = 0;
  const auto keep_flooding = [&] {
    for (size_t i = 0; i < flood.size(); ++i) {
      if (!ClosedByRouter(flood[i])) continue;
      flood[i] = ConnectingClient(b.transport.port(), from(i));
      ++reopened;
    }
  };
  const auto started = std::chrono::steady_clock::now();
  const LinkId l = a.transport.Dial(b.endpoint());
  ASSERT_NE(l, kNoLink);
  SendSome(a, l);
  ASSERT_TRUE(Pump({&a, &b}, [&] {
    keep_flooding();
    return b.recorder.got.size() == 3;
  }));
  const auto took = std::chrono::steady_clock::now() - started;
  EXPECT_LT(took, std::chrono::seconds(1)) << "the pending links' timeout is 5 s";
  EXPECT_GT(reopened, 0u);  // the flood went on while the router linked
  EXPECT_LE(b.transport.gate().waiting(), kMaxPendingNodeLinks);
  EXPECT_EQ(b.transport.LinkCount(), 1u);  // the router's link, and no connection of the flood
}

TEST_F(TlsLink, LoadingRefusesWhatCannotAuthenticateThisNode) {
  const std::string d = Dir();
  const struct {
    TlsFiles files;
    std::string node;
    std::string says;
  } cases[] = {
      {{d + "/ca.crt", d + "/missing.crt", d + "/node-a.key"}, "node-a", d + "/missing.crt"},
      {{d + "/ca.crt", d + "/node-a.crt", d + "/node-b.key"}, "node-a", "is not the key of"},
      {{d + "/ca.crt", d + "/node-b.crt", d + "/node-b.key"}, "node-a", "not of node 'node-a'"},
      {{d + "/nope.crt", d + "/node-a.crt", d + "/node-a.key"}, "node-a", d + "/nope.crt"},
  };
  for (const auto& c : cases) {
    std::string error;
    EXPECT_EQ(TlsContext::Load(c.files, c.node, &error), nullptr) << c.says;
    EXPECT_NE(error.find(c.says), std::string::npos) << error;
  }
}

}  // namespace
}  // namespace ff::router::test
