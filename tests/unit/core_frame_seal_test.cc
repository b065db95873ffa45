// Sealed frames of direct connections: what an end accepts, and everything it must refuse
// (forged, altered, replayed, reordered, reflected frames, a peer in another mode).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "freeflow/frame_seal.h"

namespace ff {
namespace {

struct Frame {
  std::string head;
  std::vector<char> body;
  uint8_t tag[kSealTagBytes];
};

// Opens `f` (a copy: opening is in place) with `c`; *body what it opened to.
bool OpenFrame(FrameCipher& c, Frame f, std::string* body = nullptr) {
  const bool ok = c.Open(f.head.data(), f.head.size(), f.body.data(), f.body.size(), f.tag);
  if (body != nullptr) body->assign(f.body.begin(), f.body.end());
  return ok;
}

// The engines this machine has: the portable pair everywhere, the vector code where the CPU
// has it (FrameSealTest runs once on each).
std::vector<FrameCipher::Engine> Engines() {
  std::vector<FrameCipher::Engine> e{FrameCipher::Engine::kPortable};
  if (FrameCipher::VectorAvailable()) e.push_back(FrameCipher::Engine::kVector);
  return e;
}

class FrameSealTest : public ::testing::TestWithParam<FrameCipher::Engine> {
 protected:
  void SetUp() override { ASSERT_TRUE(NewDirectSecret(secret_)); }

  // Init with this run's secret, then the engine under test.
  bool Init(FrameCipher* c, DirectRole self, FrameCipher::Direction dir, SealMode mode,
            uint64_t first = 0, const uint8_t (*secret)[kDirectSecretBytes] = nullptr) {
    return c->Init(secret != nullptr ? *secret : secret_, self, dir, mode, first) &&
           c->set_engine(GetParam());
  }
  // The dialler's sending side and the acceptor's receiving side of one connection.
  void Pair(SealMode mode, FrameCipher* tx, FrameCipher* rx, SealMode rx_mode) {
    ASSERT_TRUE(Init(tx, DirectRole::kDialler, FrameCipher::Direction::kSend, mode));
    ASSERT_TRUE(Init(rx, DirectRole::kAcceptor, FrameCipher::Direction::kReceive, rx_mode));
  }
  void Pair(SealMode mode) { Pair(mode, &tx_, &rx_, mode); }
  // Another receiving side of the acceptor, expecting frame number `first` next.
  FrameCipher Receiver(uint64_t first = 0) {
    FrameCipher rx;
    EXPECT_TRUE(Init(&rx, DirectRole::kAcceptor, FrameCipher::Direction::kReceive,
                     SealMode::kEncrypt, first));
    return rx;
  }

  static Frame Seal(FrameCipher& c, const std::string& head, const std::string& body) {
    Frame f{head, std::vector<char>(body.size()), {}};
    iovec v{const_cast<char*>(body.data()), body.size()};
    EXPECT_TRUE(c.Seal(f.head.data(), f.head.size(), &v, 1, f.body.data(), f.tag));
    return f;
  }
  static bool Open(FrameCipher& c, Frame f, std::string* body = nullptr) {
    return OpenFrame(c, std::move(f), body);
  }

  uint8_t secret_[kDirectSecretBytes];
  FrameCipher tx_, rx_;
};

TEST_P(FrameSealTest, AnEncryptedFrameOpensToItsBodyAndHidesIt) {
  Pair(SealMode::kEncrypt);
  const std::string body = "the payload of an RDMA WRITE, sixty-four bytes or so, in clear";
  const Frame f = Seal(tx_, "head", body);
  EXPECT_EQ(std::string(f.body.begin(), f.body.end()).find("payload"), std::string::npos);
  std::string got;
  ASSERT_TRUE(Open(rx_, f, &got));
  EXPECT_EQ(got, body);
  EXPECT_EQ(tx_.sequence(), 1u);
  EXPECT_EQ(rx_.sequence(), 1u);
}

TEST_P(FrameSealTest, AnAuthenticatedFrameTravelsInClearAndOpens) {
  Pair(SealMode::kAuthenticate);
  const Frame f = Seal(tx_, "head", "visible body");
  EXPECT_EQ(std::string(f.body.begin(), f.body.end()), "visible body");
  EXPECT_TRUE(Open(rx_, f));
}

TEST_P(FrameSealTest, FramesOpenInTheOrderTheyWereSealed) {
  Pair(SealMode::kEncrypt);
  std::vector<Frame> frames;
  for (int i = 0; i < 100; ++i) frames.push_back(Seal(tx_, "h" + std::to_string(i), std::string(i, 'x')));
  for (const Frame& f : frames) ASSERT_TRUE(Open(rx_, f));
}

TEST_P(FrameSealTest, PiecesSealAsOneBody) {
  Pair(SealMode::kEncrypt);
  const std::string a = "first piece ", b = "and the second";
  iovec v[2] = {{const_cast<char*>(a.data()), a.size()}, {const_cast<char*>(b.data()), b.size()}};
  Frame f{"head", std::vector<char>(a.size() + b.size()), {}};
  ASSERT_TRUE(tx_.Seal(f.head.data(), f.head.size(), v, 2, f.body.data(), f.tag));
  std::string got;
  ASSERT_TRUE(Open(rx_, f, &got));
  EXPECT_EQ(got, a + b);
}

TEST_P(FrameSealTest, AnAlteredBodyHeadOrTagIsRefusedInBothModes) {
  for (SealMode mode : {SealMode::kEncrypt, SealMode::kAuthenticate}) {
    for (int part = 0; part < 3; ++part) {
      FrameCipher tx, rx;
      Pair(mode, &tx, &rx, mode);
      Frame f = Seal(tx, "head bytes", "body bytes");
      if (part == 0) f.body[3] ^= 1;
      if (part == 1) f.head[2] ^= 0x40;
      if (part == 2) f.tag[15] ^= 0x80;
      EXPECT_FALSE(Open(rx, f)) << "mode " << int(mode) << " part " << part;
    }
  }
}

// The wire's frames have a 16-byte head, which every body size may follow.
const std::string kWireHead(16, 'h');

// The implementations of AES-128-GCM a cipher may use: nettle's (the portable engine's small
// bodies), OpenSSL's (its larger ones) and the vector code (where the CPU has it).
enum class Impl { kNettle, kOpenSsl, kVector };
std::vector<Impl> Impls() {
  std::vector<Impl> v{Impl::kNettle, Impl::kOpenSsl};
  if (FrameCipher::VectorAvailable()) v.push_back(Impl::kVector);
  return v;
}
void Use(FrameCipher& c, Impl impl) {
  ASSERT_TRUE(c.set_engine(impl == Impl::kVector ? FrameCipher::Engine::kVector
                                                 : FrameCipher::Engine::kPortable));
  c.set_small_body_limit(impl == Impl::kNettle ? SIZE_MAX : 0);
}

// Each implementation must open what each other sealed, in both modes, at every size on
// either side of the portable engine's bound and across the cipher's block edges, with the
// body in one piece or in three.
TEST(FrameSealInterop, FramesOfEachImplementationOpenByEachOther) {
  uint8_t secret[kDirectSecretBytes];
  ASSERT_TRUE(NewDirectSecret(secret));
  const size_t sizes[] = {0,
                          1,
                          15,
                          16,
                          17,
                          96,
                          FrameCipher::kSmallBody - 1,
                          FrameCipher::kSmallBody,
                          FrameCipher::kSmallBody + 1,
                          4096,
                          65536 + 7};
  for (SealMode mode : {SealMode::kEncrypt, SealMode::kAuthenticate}) {
    for (const Impl sender : Impls()) {
      for (const Impl receiver : Impls()) {
        FrameCipher tx, rx;
        ASSERT_TRUE(tx.Init(secret, DirectRole::kDialler, FrameCipher::Direction::kSend, mode));
        ASSERT_TRUE(rx.Init(secret, DirectRole::kAcceptor, FrameCipher::Direction::kReceive, mode));
        Use(tx, sender);
        Use(rx, receiver);
        for (const size_t n : sizes) {
          for (const int pieces : {1, 3}) {
            std::string body(n, '\0');
            for (size_t i = 0; i < n; ++i) body[i] = static_cast<char>('a' + i % 26);
            // Three pieces cut across block edges: n/3 and n/3 + 5 bytes, then the rest.
            const size_t a = pieces == 1 ? n : n / 3;
            const size_t b = pieces == 1 ? 0 : std::min(n - a, n / 3 + 5);
            iovec v[3] = {{body.data(), a}, {body.data() + a, b}, {body.data() + a + b, n - a - b}};
            Frame f{kWireHead, std::vector<char>(n), {}};
            ASSERT_TRUE(tx.Seal(f.head.data(), f.head.size(), v, pieces == 1 ? 1 : 3, f.body.data(),
                                f.tag));
            std::string got;
            EXPECT_TRUE(OpenFrame(rx, f, &got))
                << "mode " << int(mode) << " sender " << int(sender) << " receiver "
                << int(receiver) << " body " << n << " pieces " << pieces;
            EXPECT_EQ(got, body) << "body " << n << " pieces " << pieces;
          }
        }
      }
    }
  }
}

// Where the CPU has AES-NI, PCLMULQDQ and AVX2, the vector code is there and chosen: a build
// that lost it would otherwise seal at a quarter of the speed without a word.
TEST(FrameSealInterop, TheVectorEngineIsChosenWhereTheCpuHasIt) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("aes") &&
        __builtin_cpu_supports("pclmul")))
    GTEST_SKIP() << "this CPU has no AVX2 with AES-NI: the portable engine seals";
  ASSERT_TRUE(FrameCipher::VectorAvailable());
  uint8_t secret[kDirectSecretBytes];
  ASSERT_TRUE(NewDirectSecret(secret));
  FrameCipher c;
  ASSERT_TRUE(
      c.Init(secret, DirectRole::kDialler, FrameCipher::Direction::kSend, SealMode::kEncrypt));
  EXPECT_EQ(c.engine(), FrameCipher::Engine::kVector);
#else
  GTEST_SKIP() << "the vector engine is built on x86-64 only";
#endif
}

TEST_P(FrameSealTest, SmallFramesInPiecesAreRefusedWhenAltered) {
  const std::string a = "a record header ", b = "its request", c = "8 bytes!";
  for (SealMode mode : {SealMode::kEncrypt, SealMode::kAuthenticate}) {
    for (int part = 0; part < 4; ++part) {
      FrameCipher tx, rx;
      Pair(mode, &tx, &rx, mode);
      iovec v[3] = {{const_cast<char*>(a.data()), a.size()},
                    {const_cast<char*>(b.data()), b.size()},
                    {const_cast<char*>(c.data()), c.size()}};
      Frame f{kWireHead, std::vector<char>(a.size() + b.size() + c.size()), {}};
      ASSERT_TRUE(tx.Seal(f.head.data(), f.head.size(), v, 3, f.body.data(), f.tag));
      if (part == 1) f.body[a.size() + 2] ^= 1;
      if (part == 2) f.head[9] ^= 0x10;
      if (part == 3) f.tag[0] ^= 1;
      std::string got;
      EXPECT_EQ(Open(rx, f, &got), part == 0) << "mode " << int(mode) << " part " << part;
      if (part == 0) {
        EXPECT_EQ(got, a + b + c);
      }
    }
  }
}

TEST_P(FrameSealTest, AReplayedFrameIsRefused) {
  Pair(SealMode::kEncrypt);
  const Frame f = Seal(tx_, "head", "pay me once");
  ASSERT_TRUE(Open(rx_, f));
  EXPECT_FALSE(Open(rx_, f));
}

TEST_P(FrameSealTest, ReorderedOrDroppedFramesAreRefused) {
  Pair(SealMode::kEncrypt);
  const Frame first = Seal(tx_, "head", "first");
  const Frame second = Seal(tx_, "head", "second");
  EXPECT_FALSE(Open(rx_, second));  // the first never came
  FrameCipher rx2 = Receiver();
  ASSERT_TRUE(Open(rx2, first));
  EXPECT_TRUE(Open(rx2, second));
}

TEST_P(FrameSealTest, AnEndThatTakesOverAfterTheFirstFrameOpensTheSecond) {
  Pair(SealMode::kEncrypt);
  const Frame hello = Seal(tx_, "hello", "conn 7");
  const Frame next = Seal(tx_, "record", "data");
  ASSERT_TRUE(Open(rx_, hello));  // the acceptor's router checks the hello
  FrameCipher taker = Receiver(1);
  EXPECT_TRUE(Open(taker, next));
}

TEST_P(FrameSealTest, AFrameReflectedBackToItsSenderIsRefused) {
  FrameCipher own_rx;
  ASSERT_TRUE(Init(&tx_, DirectRole::kDialler, FrameCipher::Direction::kSend, SealMode::kEncrypt));
  ASSERT_TRUE(
      Init(&own_rx, DirectRole::kDialler, FrameCipher::Direction::kReceive, SealMode::kEncrypt));
  EXPECT_FALSE(Open(own_rx, Seal(tx_, "head", "to the acceptor")));
}

TEST_P(FrameSealTest, EndsThatDisagreeOnTheModeFailTheFirstFrame) {
  Pair(SealMode::kAuthenticate, &tx_, &rx_, SealMode::kEncrypt);
  EXPECT_FALSE(Open(rx_, Seal(tx_, "head", "body")));
}

TEST_P(FrameSealTest, AnotherConnectionsSecretOpensNothing) {
  FrameCipher other;
  uint8_t secret[kDirectSecretBytes];
  ASSERT_TRUE(NewDirectSecret(secret));
  ASSERT_NE(memcmp(secret, secret_, sizeof(secret)), 0);
  ASSERT_TRUE(Init(&other, DirectRole::kAcceptor, FrameCipher::Direction::kReceive,
                   SealMode::kEncrypt, 0, &secret));
  ASSERT_TRUE(Init(&tx_, DirectRole::kDialler, FrameCipher::Direction::kSend, SealMode::kEncrypt));
  EXPECT_FALSE(Open(other, Seal(tx_, "head", "body")));
}

TEST_P(FrameSealTest, AnEmptyBodyIsStillAuthenticated) {
  Pair(SealMode::kEncrypt);
  Frame f = Seal(tx_, "credit 4096", "");
  f.head[0] ^= 1;
  EXPECT_FALSE(Open(rx_, f));
}

TEST_P(FrameSealTest, AnUninitialisedCipherSealsAndOpensNothing) {
  FrameCipher c;
  uint8_t tag[kSealTagBytes] = {};
  char body[4] = {};
  EXPECT_FALSE(c.Open("h", 1, body, sizeof(body), tag));
  iovec v{body, sizeof(body)};
  EXPECT_FALSE(c.Seal("h", 1, &v, 1, body, tag));
}

INSTANTIATE_TEST_SUITE_P(Engines, FrameSealTest, ::testing::ValuesIn(Engines()),
                         [](const ::testing::TestParamInfo<FrameCipher::Engine>& i) {
                           return i.param == FrameCipher::Engine::kVector ? "vector" : "portable";
                         });

}  // namespace
}  // namespace ff
