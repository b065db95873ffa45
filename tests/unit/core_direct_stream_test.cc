// A direct connection's stream of sealed frames: what it delivers, and how it ends when the
// bytes on the connection are not the peer's frames (injected, altered, too long, unknown).
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "freeflow/direct_stream.h"

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
  // b says what every end of this release says in each frame, that it takes batches; a
  // hears it. Until then a seals every frame alone, as for an end of an earlier release.
  void IntroduceBToA() {
    ASSERT_EQ(Put(*b_, "12345678", 0, direct::Type::kCredit), DirectStream::Put::kOk);
    ASSERT_TRUE(b_->Flush());
    int heard = 0;
    for (int i = 0; i < 100 && heard == 0; ++i)
      heard = a_->Receive([](const direct::Head&, char*) { return true; });
    ASSERT_EQ(heard, 1);
    ASSERT_TRUE(a_->peer_takes_batches());
  }
  // Puts `frag` and writes it, b not reading, until a's buffer is full (or the stream died):
  // how many went in, at most `most`.
  int PutUntilFull(const std::string& frag, int most) {
    int put = 0;
    for (; put < most; ++put)
      if (Put(*a_, frag) != DirectStream::Put::kOk || !a_->Flush()) break;
    return put;
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

// What is on b's side of the connection now, left there for b to receive.
std::string Peek(int fd) {
  std::string wire(4096, '\0');
  const ssize_t n = ::recv(fd, wire.data(), wire.size(), MSG_PEEK | MSG_DONTWAIT);
  wire.resize(n > 0 ? static_cast<size_t>(n) : 0);
  return wire;
}

direct::Head HeadAt(const std::string& wire, size_t at) {
  direct::Head h{};
  if (wire.size() >= at + sizeof(h)) std::memcpy(&h, wire.data() + at, sizeof(h));
  return h;
}

TEST_F(DirectStreamTest, UntilThePeerSaysItTakesBatchesEveryFrameGoesAlone) {
  EXPECT_FALSE(a_->peer_takes_batches());
  ASSERT_EQ(Put(*a_, "one"), DirectStream::Put::kOk);
  ASSERT_EQ(Put(*a_, "two"), DirectStream::Put::kOk);
  ASSERT_TRUE(a_->Flush());
  const std::string wire = Peek(raw_b_);
  const size_t one = sizeof(direct::Head) + 3 + kSealTagBytes;
  ASSERT_EQ(wire.size(), 2 * one);
  EXPECT_EQ(HeadAt(wire, 0).type, direct::Type::kRecord);
  EXPECT_EQ(HeadAt(wire, one).type, direct::Type::kRecord);
  // What a frame of this release says about its sender; b learns it from a's frames.
  EXPECT_EQ(HeadAt(wire, 0).flags, direct::kTakesBatches);
  EXPECT_EQ(Drain().size(), 2u);
  EXPECT_TRUE(b_->peer_takes_batches());
}

TEST_F(DirectStreamTest, SmallFramesPutBetweenTwoWritesGoSealedAsOneAndArriveOneByOne) {
  IntroduceBToA();
  ASSERT_EQ(Put(*a_, "request", 7), DirectStream::Put::kOk);
  ASSERT_EQ(Put(*a_, "answer", 8, direct::Type::kResp), DirectStream::Put::kOk);
  ASSERT_EQ(Put(*a_, "12345678", 9, direct::Type::kCredit), DirectStream::Put::kOk);
  ASSERT_TRUE(a_->Flush());
  const std::string wire = Peek(raw_b_);
  // One head, the three frames' heads and bodies, one tag.
  const size_t body = 3 * sizeof(direct::Head) + 7 + 6 + 8;
  ASSERT_EQ(wire.size(), sizeof(direct::Head) + body + kSealTagBytes);
  EXPECT_EQ(HeadAt(wire, 0).type, direct::Type::kBatch);
  EXPECT_EQ(HeadAt(wire, 0).len, body);
  std::vector<Got> got = Drain();
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].type, direct::Type::kRecord);
  EXPECT_EQ(got[0].chan, 7u);
  EXPECT_EQ(got[0].body, "request");
  EXPECT_EQ(got[1].type, direct::Type::kResp);
  EXPECT_EQ(got[1].body, "answer");
  EXPECT_EQ(got[2].type, direct::Type::kCredit);
  EXPECT_EQ(got[2].chan, 9u);
  EXPECT_EQ(got[2].body, "12345678");
  // The next write's frames open under the next sequence number: the batch took one.
  ASSERT_EQ(Put(*a_, "after"), DirectStream::Put::kOk);
  ASSERT_TRUE(a_->Flush());
  got = Drain();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].body, "after");
  EXPECT_FALSE(b_->dead());
}

TEST_F(DirectStreamTest, AFrameAloneGoesAsItselfWithoutABatchAroundIt) {
  IntroduceBToA();
  ASSERT_EQ(Put(*a_, "alone", 3), DirectStream::Put::kOk);
  ASSERT_TRUE(a_->Flush());
  const std::string wire = Peek(raw_b_);
  ASSERT_EQ(wire.size(), sizeof(direct::Head) + 5 + kSealTagBytes);
  EXPECT_EQ(HeadAt(wire, 0).type, direct::Type::kRecord);
  std::vector<Got> got = Drain();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].body, "alone");
}

TEST_F(DirectStreamTest, FramesThatCannotJoinABatchCloseItAndKeepTheirPlace) {
  IntroduceBToA();
  const std::string large(DirectStream::kBatchFrameMax + 1, 'L');
  ASSERT_EQ(Put(*a_, "s1"), DirectStream::Put::kOk);
  ASSERT_EQ(Put(*a_, "s2"), DirectStream::Put::kOk);
  ASSERT_EQ(Put(*a_, large), DirectStream::Put::kOk);
  ASSERT_EQ(Put(*a_, "s3"), DirectStream::Put::kOk);
  // A burst larger than one batch's body is sealed in several.
  const std::string mid(DirectStream::kBatchFrameMax, 'm');
  const size_t many = 2 * DirectStream::kBatchBodyMax / mid.size() + 1;
  for (size_t i = 0; i < many; ++i) ASSERT_EQ(Put(*a_, mid, 100 + i), DirectStream::Put::kOk);
  ASSERT_TRUE(a_->Flush());
  std::vector<Got> got;
  for (int i = 0; i < 100 && got.size() < 4 + many; ++i) {
    std::vector<Got> more = Drain();
    got.insert(got.end(), more.begin(), more.end());
  }
  ASSERT_EQ(got.size(), 4 + many);
  EXPECT_EQ(got[0].body, "s1");
  EXPECT_EQ(got[1].body, "s2");
  EXPECT_EQ(got[2].body, large);
  EXPECT_EQ(got[3].body, "s3");
  for (size_t i = 0; i < many; ++i) {
    EXPECT_EQ(got[4 + i].chan, 100 + i);
    EXPECT_EQ(got[4 + i].body, mid);
  }
  EXPECT_FALSE(b_->dead());
}

TEST_F(DirectStreamTest, AnswersPastAFullSocketKeepTheirBatchesWhenTheBufferMovesAndGrows) {
  IntroduceBToA();
  const std::string frag(32 * 1024, 'r');
  int got_records = 0, got_answers = 0;
  auto take = [&](const direct::Head& h, char* body) {
    if (h.type == direct::Type::kRecord) {
      EXPECT_EQ(got_answers, 0);
      EXPECT_EQ(std::string(body, h.len), frag);
      ++got_records;
    } else {
      EXPECT_EQ(std::string(body, h.len), "answer " + std::to_string(got_answers));
      ++got_answers;
    }
    return true;
  };
  // Records up to the send limit, b not reading: the socket is full and the buffer too.
  const int records = PutUntilFull(frag, 1000);
  ASSERT_LT(records, 1000);
  ASSERT_FALSE(a_->dead());
  // b takes some, a writes some more: the buffer's front has gone, its back not.
  ASSERT_GT(b_->Receive(take), 0);
  ASSERT_TRUE(a_->Flush());
  ASSERT_GT(a_->unsent(), 0u);
  // Answers, which may go past the send limit, in batches: the buffer's unsent bytes move to
  // its front and it grows while a batch is open.
  constexpr int kAnswers = 60000;  // about 1.7 MiB: more than the buffer holds
  for (int i = 0; i < kAnswers; ++i) {
    const std::string body = "answer " + std::to_string(i);
    iovec v{const_cast<char*>(body.data()), body.size()};
    ASSERT_EQ(a_->PutFrame(direct::Type::kResp, 5, 0, &v, 1, DirectStream::Priority::kAnswer),
              DirectStream::Put::kOk);
  }
  for (int i = 0; i < 100000 && got_answers < kAnswers && !b_->dead(); ++i) {
    ASSERT_TRUE(a_->Flush());
    b_->Receive(take);
  }
  EXPECT_EQ(got_records, records);
  EXPECT_EQ(got_answers, kAnswers);
  EXPECT_FALSE(b_->dead()) << b_->why_dead();
}

TEST_F(DirectStreamTest, ABatchPutAsAFrameEndsTheSendersStream) {
  EXPECT_EQ(Put(*a_, std::string(sizeof(direct::Head), '\0'), 1, direct::Type::kBatch),
            DirectStream::Put::kDead);
  EXPECT_TRUE(a_->dead());
}

TEST_F(DirectStreamTest, ABatchAlteredInFlightHandsOutNoneOfItsFrames) {
  IntroduceBToA();
  ASSERT_EQ(Put(*a_, "one"), DirectStream::Put::kOk);
  ASSERT_EQ(Put(*a_, "two"), DirectStream::Put::kOk);
  ASSERT_EQ(Put(*a_, "three"), DirectStream::Put::kOk);
  ASSERT_TRUE(a_->Flush());
  char wire[512];
  const ssize_t n = ::read(raw_b_, wire, sizeof(wire));
  ASSERT_GT(n, 0);
  // A byte of the last frame's body flips: the first two must not be handed out either.
  wire[n - kSealTagBytes - 1] ^= 1;
  ASSERT_EQ(::write(raw_a_, wire, n), n);
  EXPECT_TRUE(Drain().empty());
  EXPECT_TRUE(b_->violated());
}

// A peer that holds the key seals batches the wire does not allow: each ends the connection,
// after the frames before the bad one, which the peer had every right to send.
struct BadBatch {
  const char* name;
  std::string (*body)();
};

void PrintTo(const BadBatch& b, std::ostream* os) { *os << b.name; }

std::string Frame(direct::Type type, uint32_t len, const std::string& body) {
  const direct::Head h{len, type, 0, 1, 0};
  return std::string(reinterpret_cast<const char*>(&h), sizeof(h)) + body;
}

const BadBatch kBadBatches[] = {
    {"AFrameRunningPastTheBatch",
     [] { return Frame(direct::Type::kRecord, 2, "ok") + Frame(direct::Type::kRecord, 64, "x"); }},
    {"AHelloInside",
     [] { return Frame(direct::Type::kRecord, 2, "ok") + Frame(direct::Type::kHello, 1, "x"); }},
    {"ABatchInside",
     [] {
       return Frame(direct::Type::kRecord, 2, "ok") +
              Frame(direct::Type::kBatch, 18, Frame(direct::Type::kRecord, 2, "in"));
     }},
    {"AnUnknownTypeInside",
     [] {
       return Frame(direct::Type::kRecord, 2, "ok") + Frame(static_cast<direct::Type>(99), 0, "");
     }},
    {"ATailShorterThanAHead",
     [] { return Frame(direct::Type::kRecord, 2, "ok") + std::string(5, '\0'); }},
    {"NothingInside", [] { return std::string(); }},
};

class BadBatchTest : public DirectStreamTest, public ::testing::WithParamInterface<BadBatch> {};

TEST_P(BadBatchTest, EndsTheConnectionAfterTheFramesBeforeIt) {
  // Sealed as a's stream would seal its first frame, with the connection's key.
  FrameCipher tx;
  ASSERT_TRUE(
      tx.Init(secret_, DirectRole::kDialler, FrameCipher::Direction::kSend, SealMode::kEncrypt));
  std::string body = GetParam().body();
  const direct::Head h{static_cast<uint32_t>(body.size()), direct::Type::kBatch, 0, 0, 0};
  std::string wire(reinterpret_cast<const char*>(&h), sizeof(h));
  const iovec v{body.data(), body.size()};
  uint8_t tag[kSealTagBytes];
  ASSERT_TRUE(tx.Seal(&h, sizeof(h), &v, 1, body.data(), tag));
  wire += body + std::string(reinterpret_cast<char*>(tag), sizeof(tag));
  ASSERT_EQ(::write(raw_a_, wire.data(), wire.size()), static_cast<ssize_t>(wire.size()));
  std::vector<Got> got = Drain();
  EXPECT_TRUE(b_->dead());
  EXPECT_TRUE(b_->violated());
  EXPECT_NE(std::string(b_->why_dead()).find("batch"), std::string::npos) << b_->why_dead();
  for (const Got& g : got) EXPECT_EQ(g.body, "ok");
  EXPECT_LE(got.size(), 1u);
}

INSTANTIATE_TEST_SUITE_P(Wire, BadBatchTest, ::testing::ValuesIn(kBadBatches),
                         [](const auto& info) { return std::string(info.param.name); });

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
  EXPECT_LT(PutUntilFull(frag, 10000), 10000);
  EXPECT_GT(a_->unsent(), 0u);
  EXPECT_LE(a_->unsent(), 256u * 1024);
  EXPECT_FALSE(a_->dead());
}

}  // namespace
}  // namespace ff
