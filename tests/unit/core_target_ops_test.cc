// Unit tests of the target-side operations shared by the library (same node) and the
// router (remote initiators): credits, access checks, region bounds, atomics, wake-ups.
#include <gtest/gtest.h>
#include <sys/eventfd.h>
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

TEST(Access, AcceptsInBoundsWithTheRightFlags) {
  Fixture f;
  MrView v{};
  EXPECT_EQ(CheckRemoteAccess(&f.qp, f.table.get(), f.key, 0x10000, 4096, IBV_ACCESS_REMOTE_WRITE, &v),
            IBV_WC_SUCCESS);
  EXPECT_EQ(RegionOffset(v, 0x10010, 16, 8192), 512 + 16);
}

TEST(Access, RefusesForgedKeysBoundsAndFlags) {
  Fixture f;
  MrView v{};
  EXPECT_EQ(CheckRemoteAccess(&f.qp, f.table.get(), f.key ^ 1, 0x10000, 8, IBV_ACCESS_REMOTE_WRITE, &v),
            IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(CheckRemoteAccess(&f.qp, f.table.get(), f.key, 0x10000 + 4090, 8, IBV_ACCESS_REMOTE_WRITE, &v),
            IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(CheckRemoteAccess(&f.qp, f.table.get(), f.key, 0xff00, 8, IBV_ACCESS_REMOTE_WRITE, &v),
            IBV_WC_REM_ACCESS_ERR);
  // The MR lacks REMOTE_READ even though the QP allows it.
  EXPECT_EQ(CheckRemoteAccess(&f.qp, f.table.get(), f.key, 0x10000, 8, IBV_ACCESS_REMOTE_READ, &v),
            IBV_WC_REM_ACCESS_ERR);
  // The QP lacks REMOTE_ATOMIC.
  EXPECT_EQ(CheckRemoteAccess(&f.qp, f.table.get(), f.key, 0x10000, 8, IBV_ACCESS_REMOTE_ATOMIC, &v),
            IBV_WC_REM_ACCESS_ERR);
}

TEST(Access, RegionOffsetRefusesEntriesPointingOutsideTheRegion) {
  Fixture f;
  MrView v{};
  ASSERT_EQ(CheckRemoteAccess(&f.qp, f.table.get(), f.key, 0x10000, 4096, IBV_ACCESS_REMOTE_WRITE, &v),
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
  const int fd = ::eventfd(0, EFD_NONBLOCK);
  ASSERT_GE(fd, 0);
  uint64_t v = 0;
  WakeIfArmed(&slot, fd);
  EXPECT_LT(::read(fd, &v, sizeof(v)), 0);  // not armed: nothing written
  slot.armed.store(1);
  WakeIfArmed(&slot, fd);
  WakeIfArmed(&slot, fd);
  EXPECT_EQ(::read(fd, &v, sizeof(v)), static_cast<ssize_t>(sizeof(v)));
  EXPECT_EQ(v, 1u);
  EXPECT_EQ(slot.fired.load(), 1u);
  EXPECT_EQ(slot.armed.load(), 0u);
  ::close(fd);
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
