// Unit tests of the target-side operations shared by the library (same node) and the
// router (remote initiators): credits, access checks, region bounds, atomics, wake-ups.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>

#include "freeflow/target_ops.h"

namespace ff {
namespace {

TEST(Credits, ClaimsOnlyWhatWasPosted) {
  RecvCredits c;
  uint64_t cache = 0;
  EXPECT_FALSE(ClaimCredit(&c, &cache));
  c.posted.store(2);
  EXPECT_TRUE(ClaimCredit(&c, &cache));
  EXPECT_TRUE(ClaimCredit(&c, &cache));
  EXPECT_FALSE(ClaimCredit(&c, &cache));
  EXPECT_EQ(c.claimed.load(), 2u);
}

constexpr uint32_t kTargetQpn = 0x123;

struct Fixture {
  Fixture() : table(new MrEntry[kMrTableSlots]) {
    qp.qp_access.store(IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
    MrEntry& e = table[3];
    e.key.store(key);
    e.access.store(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    e.addr.store(0x10000);
    e.length.store(4096);
    e.region_offset.store(512);
    e.seq.store(2);
  }
  QpSegmentHeader qp;
  std::unique_ptr<MrEntry[]> table;
  const uint32_t key = (3u << 8) | 9;
};

// A memory window of type 2 names the QP it was bound through: another QP of the owner does
// not serve it, even with the right key, range and rights.
TEST(Access, ATypeTwoWindowServesOnlyItsQp) {
  Fixture f;
  f.table[3].qpn.store(kTargetQpn);
  MrView v;
  EXPECT_EQ(CheckRemoteAccess(&f.qp, kTargetQpn, f.table.get(), f.key, 0x10000, 8,
                              IBV_ACCESS_REMOTE_WRITE, &v),
            IBV_WC_SUCCESS);
  EXPECT_EQ(CheckRemoteAccess(&f.qp, kTargetQpn + 1, f.table.get(), f.key, 0x10000, 8,
                              IBV_ACCESS_REMOTE_WRITE, &v),
            IBV_WC_REM_ACCESS_ERR);
}

// A key serves only QPs of the protection domain it was registered in, as a responder HCA
// checks the PD of the MR against the QP's.
TEST(Access, AKeyOfAnotherProtectionDomainThanTheQpsIsRefused) {
  Fixture f;
  f.qp.pd.store(5);
  f.table[3].pd.store(6);
  MrView v;
  EXPECT_EQ(CheckRemoteAccess(&f.qp, kTargetQpn, f.table.get(), f.key, 0x10000, 8,
                              IBV_ACCESS_REMOTE_WRITE, &v),
            IBV_WC_REM_ACCESS_ERR);
  f.table[3].pd.store(5);
  EXPECT_EQ(CheckRemoteAccess(&f.qp, kTargetQpn, f.table.get(), f.key, 0x10000, 8,
                              IBV_ACCESS_REMOTE_WRITE, &v),
            IBV_WC_SUCCESS);
  EXPECT_EQ(v.pd, 5u);
}

TEST(Access, AcceptsInBoundsWithTheRightFlags) {
  Fixture f;
  MrView v{};
  EXPECT_EQ(CheckRemoteAccess(&f.qp, kTargetQpn, f.table.get(), f.key, 0x10000, 4096,
                              IBV_ACCESS_REMOTE_WRITE, &v),
            IBV_WC_SUCCESS);
  EXPECT_EQ(RegionOffset(v, 0x10010, 16, 8192), 512 + 16);
}

TEST(Access, RefusesForgedKeysBoundsAndFlags) {
  Fixture f;
  MrView v{};
  EXPECT_EQ(CheckRemoteAccess(&f.qp, kTargetQpn, f.table.get(), f.key ^ 1, 0x10000, 8,
                              IBV_ACCESS_REMOTE_WRITE, &v),
            IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(CheckRemoteAccess(&f.qp, kTargetQpn, f.table.get(), f.key, 0x10000 + 4090, 8,
                              IBV_ACCESS_REMOTE_WRITE, &v),
            IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(CheckRemoteAccess(&f.qp, kTargetQpn, f.table.get(), f.key, 0xff00, 8,
                              IBV_ACCESS_REMOTE_WRITE, &v),
            IBV_WC_REM_ACCESS_ERR);
  // The MR lacks REMOTE_READ even though the QP allows it.
  EXPECT_EQ(CheckRemoteAccess(&f.qp, kTargetQpn, f.table.get(), f.key, 0x10000, 8,
                              IBV_ACCESS_REMOTE_READ, &v),
            IBV_WC_REM_ACCESS_ERR);
  // The QP lacks REMOTE_ATOMIC.
  EXPECT_EQ(CheckRemoteAccess(&f.qp, kTargetQpn, f.table.get(), f.key, 0x10000, 8,
                              IBV_ACCESS_REMOTE_ATOMIC, &v),
            IBV_WC_REM_ACCESS_ERR);
}

TEST(Access, RegionOffsetRefusesEntriesPointingOutsideTheRegion) {
  Fixture f;
  MrView v{};
  ASSERT_EQ(CheckRemoteAccess(&f.qp, kTargetQpn, f.table.get(), f.key, 0x10000, 4096,
                              IBV_ACCESS_REMOTE_WRITE, &v),
            IBV_WC_SUCCESS);
  EXPECT_EQ(RegionOffset(v, 0x10000, 4096, 4096), -1);  // 512 + 4096 > 4096
}

TEST(Atomics, FetchAddAndCompareSwapReturnTheOriginal) {
  uint64_t word = 40;
  EXPECT_EQ(AtomicOp(&word, IBV_WR_ATOMIC_FETCH_AND_ADD, 2, 0), 40u);
  EXPECT_EQ(word, 42u);
  EXPECT_EQ(AtomicOp(&word, IBV_WR_ATOMIC_CMP_AND_SWP, 41, 7), 42u);  // no match: unchanged
  EXPECT_EQ(word, 42u);
  EXPECT_EQ(AtomicOp(&word, IBV_WR_ATOMIC_CMP_AND_SWP, 42, 7), 42u);
  EXPECT_EQ(word, 7u);
}

TEST(Wake, SignalsOnlyAnArmedSlotAndOnlyOnce) {
  NotifySlot slot;
  UniqueFd rx, tx;
  ASSERT_EQ(CreateWakePair(&rx, &tx, true), 0);
  EXPECT_TRUE(IsWakeSocket(tx.get()));
  WakeIfArmed(&slot, tx.get(), false);
  EXPECT_EQ(DrainWakes(rx.get()), 0);  // not armed: nothing sent
  slot.armed.store(1);
  WakeIfArmed(&slot, tx.get(), false);
  WakeIfArmed(&slot, tx.get(), false);
  EXPECT_EQ(DrainWakes(rx.get()), 1);
  EXPECT_NE(slot.fired.load(), 0u);  // when it fired: events are taken oldest first
  EXPECT_EQ(slot.armed.load(), 0u);
}

// The sleeper holds both ends of its wake socket and may do anything to them: clear
// O_NONBLOCK on the sending end (a shared open file description) and fill the queue. A
// waker still never blocks (MSG_DONTWAIT is per call), and the sleeper is still woken.
TEST(Wake, AWakerNeverBlocksWhateverTheSleeperDidToItsSocket) {
  UniqueFd rx, tx;
  ASSERT_EQ(CreateWakePair(&rx, &tx, true), 0);
  ASSERT_EQ(::fcntl(tx.get(), F_SETFL, 0), 0);  // blocking, as a hostile owner would make it
  const uint64_t start = MonotonicNs();
  for (int i = 0; i < 5000; ++i) SendWake(tx.get());  // far past the queue's capacity
  EXPECT_LT(MonotonicNs() - start, 2'000'000'000ull);
  pollfd p{rx.get(), POLLIN, 0};
  EXPECT_EQ(::poll(&p, 1, 0), 1);
  EXPECT_GT(DrainWakes(rx.get()), 0);
  // Closed receiving end: no SIGPIPE, no error to the waker.
  rx.reset();
  SendWake(tx.get());
}

// An eventfd is not a wake socket: the router refuses one wherever it would wake through it.
TEST(Wake, AnEventfdOrAStreamSocketIsNotAWakeSocket) {
  UniqueFd efd(::eventfd(0, EFD_CLOEXEC));
  EXPECT_FALSE(IsWakeSocket(efd.get()));
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  UniqueFd a(sv[0]), b(sv[1]);
  EXPECT_FALSE(IsWakeSocket(a.get()));
}

}  // namespace
}  // namespace ff

namespace ff {
namespace {

TEST(Rnr, CountsOneRetryPerTimerExpiryAndGivesUpAfterTheBudget) {
  RnrState s;
  const uint64_t t = RnrTimerNs(1);  // 10 us
  EXPECT_EQ(t, 10000u);
  EXPECT_FALSE(RnrRetryExhausted(&s, 1, 2, 1000));          // first refusal: timer starts
  EXPECT_FALSE(RnrRetryExhausted(&s, 1, 2, 1000 + t / 2));  // timer running: no retry counted
  EXPECT_EQ(s.tries, 0u);
  EXPECT_FALSE(RnrRetryExhausted(&s, 1, 2, 1000 + t));      // retry 1
  EXPECT_FALSE(RnrRetryExhausted(&s, 1, 2, 1000 + 2 * t));  // retry 2
  EXPECT_TRUE(RnrRetryExhausted(&s, 1, 2, 1000 + 3 * t));   // third retry exceeds rnr_retry 2
}

TEST(Rnr, SevenMeansRetryForever) {
  RnrState s;
  for (uint64_t now = 1; now < 1000 * RnrTimerNs(1); now += RnrTimerNs(1))
    ASSERT_FALSE(RnrRetryExhausted(&s, 1, 7, now));
  EXPECT_GT(s.tries, 900u);
}

}  // namespace
}  // namespace ff
