// A direct connection's stream of sealed frames: what it delivers, and how it ends when the
// bytes on the connection are not the peer's frames (injected, altered, too long, unknown).
#include "freeflow/direct_stream.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

namespace ff {
namespace {

struct Got {
  direct::Type type;
  uint32_t chan;
  std::string body;
};

class DirectStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    raw_a_ = sv[0];
    raw_b_ = sv[1];
    ASSERT_TRUE(NewDirectSecret(secret_));
    a_ = std::make_unique<DirectStream>(UniqueFd(sv[0]));
    b_ = std::make_unique<DirectStream>(UniqueFd(sv[1]));
    DirectStream::Setup s;
    s.secret = &secret_;
    s.role = DirectRole::kDialler;
    ASSERT_TRUE(a_->Init(s));
    s.role = DirectRole::kAcceptor;
    ASSERT_TRUE(b_->Init(s));
  }

  static DirectStream::Put Put(DirectStream& s, const std::string& body, uint32_t chan = 1,
                               direct::Type type = direct::Type::kRecord) {
    iovec v{const_cast<char*>(body.data()), body.size()};
    return s.PutFrame(type, chan, 0, &v, 1);
  }
  // Everything b can take now.
  std::vector<Got> Drain() {
    std::vector<Got> got;
    for (int i = 0; i < 100; ++i) {
      const int n = b_->Receive([&](const direct::Head& h, char* body) {
        got.push_back({h.type, h.chan, std::string(body, h.len)});
        return true;
      });
      if (n <= 0) break;
    }
    return got;
  }

  uint8_t secret_[kDirectSecretBytes];
  int raw_a_ = -1, raw_b_ = -1;
  std::unique_ptr<DirectStream> a_, b_;
};

TEST_F(DirectStreamTest, FramesArriveWholeInOrderWithTheirChannels) {
  std::vector<std::string> sent;
  for (uint32_t i = 0; i < 50; ++i) {
    sent.push_back(std::string(i * 97, static_cast<char>('a' + i % 26)));
    ASSERT_EQ(Put(*a_, sent.back(), i), DirectStream::Put::kOk);
    ASSERT_TRUE(a_->Flush());
  }
  std::vector<Got> got = Drain();
  ASSERT_EQ(got.size(), sent.size());
  for (uint32_t i = 0; i < sent.size(); ++i) {
    EXPECT_EQ(got[i].chan, i);
    EXPECT_EQ(got[i].body, sent[i]);
  }
}

TEST_F(DirectStreamTest, TheLargestBodyPassesAndALargerOneIsNeverPut) {
  ASSERT_EQ(Put(*a_, std::string(direct::kMaxBody, 'x')), DirectStream::Put::kOk);
  ASSERT_TRUE(a_->Flush());
  std::vector<Got> got;
  for (int i = 0; i < 100 && got.empty(); ++i) got = Drain();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].body.size(), direct::kMaxBody);
  EXPECT_EQ(Put(*a_, std::string(direct::kMaxBody + 1, 'x')), DirectStream::Put::kDead);
}

TEST_F(DirectStreamTest, AFrameLeftForLaterIsHandedOutAgainWithoutReopening) {
  ASSERT_EQ(Put(*a_, "first"), DirectStream::Put::kOk);
  ASSERT_EQ(Put(*a_, "second"), DirectStream::Put::kOk);
  ASSERT_TRUE(a_->Flush());
  int offered = 0;
  EXPECT_EQ(b_->Receive([&](const direct::Head&, char*) { return ++offered > 1; }), 0);
  std::vector<Got> got = Drain();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].body, "first");
  EXPECT_FALSE(b_->dead());
}

TEST_F(DirectStreamTest, BytesInjectedBetweenFramesEndTheConnection) {
  ASSERT_EQ(Put(*a_, "genuine"), DirectStream::Put::kOk);
  ASSERT_TRUE(a_->Flush());
  // A forged frame: a plausible head, a body and a tag nobody sealed.
  direct::Head h{4, direct::Type::kRecord, 0, 1, 0};
  std::string forged(reinterpret_cast<char*>(&h), sizeof(h));
  forged += "evil" + std::string(kSealTagBytes, '\0');
  ASSERT_EQ(::write(raw_a_, forged.data(), forged.size()), static_cast<ssize_t>(forged.size()));
  std::vector<Got> got = Drain();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].body, "genuine");
  EXPECT_TRUE(b_->dead());
  EXPECT_NE(std::string(b_->why_dead()).find("did not open"), std::string::npos);
  EXPECT_EQ(b_->Receive([](const direct::Head&, char*) { return true; }), -1);
}

TEST_F(DirectStreamTest, AHeadOverTheLargestBodyEndsTheConnectionBeforeItsBody) {
  direct::Head h{direct::kMaxBody + 1, direct::Type::kRecord, 0, 1, 0};
  ASSERT_EQ(::write(raw_a_, &h, sizeof(h)), static_cast<ssize_t>(sizeof(h)));
  Drain();
  EXPECT_TRUE(b_->dead());
}

TEST_F(DirectStreamTest, AnUnknownFrameTypeEndsTheConnection) {
  ASSERT_EQ(Put(*a_, "x", 1, static_cast<direct::Type>(99)), DirectStream::Put::kOk);
  ASSERT_TRUE(a_->Flush());
  Drain();
  EXPECT_TRUE(b_->dead());
}

TEST_F(DirectStreamTest, ARecordedFrameReplayedEndsTheConnection) {
  ASSERT_EQ(Put(*a_, "pay once"), DirectStream::Put::kOk);
  ASSERT_TRUE(a_->Flush());
  // Record what went over the wire by reading it on b's side raw, then play it twice.
  char wire[256];
  const ssize_t n = ::read(raw_b_, wire, sizeof(wire));
  ASSERT_GT(n, 0);
  ASSERT_EQ(::write(raw_a_, wire, n), n);
  ASSERT_EQ(::write(raw_a_, wire, n), n);
  std::vector<Got> got = Drain();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(b_->dead());
}

TEST_F(DirectStreamTest, ThePeerClosingEndsTheConnection) {
  a_.reset();
  Drain();
  EXPECT_TRUE(b_->dead());
  EXPECT_NE(std::string(b_->why_dead()).find("closed"), std::string::npos);
}

TEST_F(DirectStreamTest, APeerThatNeverReadsFillsTheSendLimitAndNoMore) {
  a_->set_send_limit(256 * 1024);
  const std::string frag(32 * 1024, 'z');
  int put = 0;
  for (; put < 10000; ++put) {
    const DirectStream::Put r = Put(*a_, frag);
    if (r == DirectStream::Put::kFull) break;
    ASSERT_EQ(r, DirectStream::Put::kOk);
    ASSERT_TRUE(a_->Flush());
  }
  EXPECT_LT(put, 10000);
  EXPECT_GT(a_->unsent(), 0u);
  EXPECT_LE(a_->unsent(), 256u * 1024);
  EXPECT_FALSE(a_->dead());
}

}  // namespace
}  // namespace ff
