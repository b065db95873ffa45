// The dial policy (fsocket/src/dial_policy.h, docs/tcp-mode.md "Short connections"): which
// connects to a destination are accelerated, which go to the kernel, and that only one look
// at a time is made once the kernel has had its turn there.
#include "dial_policy.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>

#include <cstdint>

#include "epoll.h"  // Sock holds an EpollShadow
#include "freeflow/stream_segment.h"
#include "freeflow/tunables.h"
#include "sock.h"

namespace ff::fsocket {
namespace {

// A destination of its own for each test (the table is the process's).
struct Destination {
  uint32_t ip_net;
  uint16_t port;  // host order

  Dial Next() const { return DialKind(ip_net, htons(port)); }
};

// A stream to `to` that this process dialed (as `look` says), with rings that moved `moved`
// bytes in `exchanges` calls, then ended: short unless those say otherwise.
void DialAndEnd(const Destination& to, bool look, uint64_t moved = 0, uint64_t exchanges = 2) {
  StreamRingHeader tx{}, rx{};
  tx.tail.store(moved);
  Sock s;
  s.tx = &tx;
  s.rx = &rx;
  s.peer_ip_net = to.ip_net;
  s.peer_port = to.port;
  NoteDialed(s, look);
  s.exchanges.store(exchanges);
  NoteDialedEnd(s);
}

// Three short connections, then the kernel's first turn taken: the next connect is the look.
void LearnShort(const Destination& to) {
  for (uint32_t i = 0; i < kShortStreamRun; ++i) {
    ASSERT_EQ(to.Next(), Dial::kAccelerate);
    DialAndEnd(to, false);
  }
  for (uint32_t i = 0; i < kShortSkipFirst; ++i) ASSERT_EQ(to.Next(), Dial::kKernel) << i;
}

TEST(DialPolicy, ShortConnectionsGiveTheKernelARunThenOneLook) {
  const Destination to{htonl(0x0af00001), 7001};
  LearnShort(to);
  EXPECT_EQ(to.Next(), Dial::kLook);
  DialAndEnd(to, true);  // short again: a run twice as long
  for (uint32_t i = 0; i < 2 * kShortSkipFirst; ++i) ASSERT_EQ(to.Next(), Dial::kKernel) << i;
  EXPECT_EQ(to.Next(), Dial::kLook);
}

TEST(DialPolicy, WhileTheLookIsOpenOtherConnectsAreKernel) {
  const Destination to{htonl(0x0af00002), 7002};
  LearnShort(to);
  ASSERT_EQ(to.Next(), Dial::kLook);
  // Several connections under way at once (ab -c 4): before, each of these was a look too.
  for (int i = 0; i < 10; ++i) EXPECT_EQ(to.Next(), Dial::kKernel) << i;
  DialAndEnd(to, true);
  for (uint32_t i = 0; i < 2 * kShortSkipFirst; ++i) ASSERT_EQ(to.Next(), Dial::kKernel) << i;
}

TEST(DialPolicy, ALookNotMadeLetsTheNextConnectLook) {
  const Destination to{htonl(0x0af00003), 7003};
  LearnShort(to);
  ASSERT_EQ(to.Next(), Dial::kLook);
  LookNotMade(to.ip_net, htons(to.port));  // the router did not answer: kernel TCP instead
  EXPECT_EQ(to.Next(), Dial::kLook);
}

TEST(DialPolicy, ALongLookStartsAfresh) {
  const Destination to{htonl(0x0af00004), 7004};
  LearnShort(to);
  ASSERT_EQ(to.Next(), Dial::kLook);
  DialAndEnd(to, true, kShortStreamBytes);  // it moved a lot: the pattern changed
  for (uint32_t i = 0; i < kShortStreamRun + 2; ++i) EXPECT_EQ(to.Next(), Dial::kAccelerate) << i;
}

// A connection judged by what it carried: a chatty one with few bytes (a pool's connection of
// small requests) is worth its segment; one of a request or two is short, however long it
// lived (a forked database backend starting takes milliseconds), as nothing here measures
// time.
TEST(DialPolicy, ManyExchangesAreLongAndFewAreShort) {
  const Destination to{htonl(0x0af00005), 7005};
  for (uint32_t i = 0; i < kShortStreamRun + 2; ++i) {
    ASSERT_EQ(to.Next(), Dial::kAccelerate) << i;
    DialAndEnd(to, false, 64 * kShortStreamExchanges, kShortStreamExchanges);
  }
  for (uint32_t i = 0; i < kShortStreamRun; ++i) {
    ASSERT_EQ(to.Next(), Dial::kAccelerate) << i;
    DialAndEnd(to, false, 64 * (kShortStreamExchanges - 1), kShortStreamExchanges - 1);
  }
  EXPECT_EQ(to.Next(), Dial::kKernel) << "three of fewer than kShortStreamExchanges: short";
}

}  // namespace
}  // namespace ff::fsocket
