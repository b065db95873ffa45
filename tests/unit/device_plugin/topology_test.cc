#include "topology.h"

#include <gtest/gtest.h>

namespace ff::dp {
namespace {

// 0000:5e:00.2/.3 on NUMA 0 (different switches), af:00.2/.3 on NUMA 1 (one switch).
std::vector<PluginDevice> numa_fixture() {
  return {
      {"a0", true, {0}, "sw-a"}, {"a1", true, {0}, "sw-b"}, {"a2", true, {0}, "sw-b"},
      {"b0", true, {1}, "sw-c"}, {"b1", true, {1}, "sw-c"}, {"x", true, {}, ""},
  };
}

std::vector<std::string> ids(const std::vector<PluginDevice>& d) {
  std::vector<std::string> out;
  for (const auto& x : d) out.push_back(x.id);
  return out;
}

TEST(Topology, PicksOneNumaNodeBestFit) {
  auto devs = numa_fixture();
  // Two devices fit on NUMA 1 exactly (best fit), leaving NUMA 0's three whole.
  EXPECT_EQ(preferred_allocation(devs, ids(devs), {}, 2), (std::vector<std::string>{"b0", "b1"}));
  // Three only fit on NUMA 0.
  auto three = preferred_allocation(devs, ids(devs), {}, 3);
  EXPECT_EQ(three, (std::vector<std::string>{"a1", "a2", "a0"}));
}

TEST(Topology, PrefersOneSwitchInsideTheNode) {
  auto devs = numa_fixture();
  std::vector<std::string> avail = {"a0", "a1", "a2", "x"};
  EXPECT_EQ(preferred_allocation(devs, avail, {}, 2), (std::vector<std::string>{"a1", "a2"}));
}

TEST(Topology, HonoursMustInclude) {
  auto devs = numa_fixture();
  EXPECT_EQ(preferred_allocation(devs, ids(devs), {"a0"}, 2),
            (std::vector<std::string>{"a0", "a1"}));
  EXPECT_EQ(preferred_allocation(devs, ids(devs), {"b1"}, 2),
            (std::vector<std::string>{"b1", "b0"}));
  // must_include larger than the request is returned whole.
  EXPECT_EQ(preferred_allocation(devs, ids(devs), {"a0", "b0"}, 1),
            (std::vector<std::string>{"a0", "b0"}));
}

TEST(Topology, SpillsOverWhenOneNodeIsNotEnough) {
  auto devs = numa_fixture();
  auto all = preferred_allocation(devs, ids(devs), {}, 5);
  ASSERT_EQ(all.size(), 5u);
  EXPECT_EQ(std::vector<std::string>(all.begin(), all.begin() + 3),
            (std::vector<std::string>{"a1", "a2", "a0"}));
  EXPECT_EQ(preferred_allocation(devs, {"a0"}, {}, 3).size(), 1u);
  EXPECT_TRUE(preferred_allocation(devs, {}, {}, 0).empty());
}

TEST(Topology, UnknownIdsHaveNoTopology) {
  EXPECT_EQ(preferred_allocation({}, {"z", "y"}, {}, 1), (std::vector<std::string>{"y"}));
}

}  // namespace
}  // namespace ff::dp
