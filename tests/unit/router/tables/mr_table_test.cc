// The router's MR table on its own: keys, the table's capacity, slots recycled with a new tag.
#include "objects/mr_table.h"

#include <gtest/gtest.h>

#include <vector>

namespace ff::router {
namespace {

MrView Registration(uint64_t addr) {
  MrView v{};
  v.addr = addr;
  v.length = 4096;
  v.access = 1;
  return v;
}

TEST(MrTableTest, NothingCanBeAddedBeforeTheTableExists) {
  MrTable t;
  uint32_t key = 0;
  EXPECT_EQ(t.Add(Registration(0x1000), &key), ENOMEM);
  EXPECT_EQ(t.size(), 0u);
}

TEST(MrTableTest, HoldsOneEntryPerSlotButSlotZeroAndNoMore) {
  MrTable t;
  ASSERT_EQ(t.Create(), 0);
  std::vector<uint32_t> keys;
  for (uint32_t i = 1; i < kMrTableSlots; ++i) {
    uint32_t key = 0;
    ASSERT_EQ(t.Add(Registration(i * 4096ull), &key), 0) << i;
    ASSERT_NE(MrSlotOfKey(key), 0u);
    keys.push_back(key);
  }
  EXPECT_EQ(t.size(), kMrTableSlots - 1);
  uint32_t key = 0;
  EXPECT_EQ(t.Add(Registration(0), &key), ENOMEM);
  MrView v{};
  ASSERT_TRUE(t.Find(keys[100], &v));
  EXPECT_EQ(v.addr, 101 * 4096ull);
}

TEST(MrTableTest, AFreedSlotComesBackUnderANewKey) {
  MrTable t;
  ASSERT_EQ(t.Create(), 0);
  uint32_t first = 0, second = 0, again = 0, region = 0;
  ASSERT_EQ(t.Add(Registration(0x1000), &first), 0);
  ASSERT_EQ(t.Add(Registration(0x2000), &second), 0);
  ASSERT_EQ(t.Remove(first, &region), 0);
  EXPECT_EQ(t.size(), 1u);
  ASSERT_EQ(t.Add(Registration(0x3000), &again), 0);
  EXPECT_EQ(MrSlotOfKey(again), MrSlotOfKey(first));
  EXPECT_NE(again, first);
  MrView v{};
  EXPECT_FALSE(t.Find(first, &v));  // the stale key names nothing
  ASSERT_TRUE(t.Find(again, &v));
  EXPECT_EQ(v.addr, 0x3000u);
  EXPECT_EQ(t.Remove(first, &region), EINVAL);
}

}  // namespace
}  // namespace ff::router
