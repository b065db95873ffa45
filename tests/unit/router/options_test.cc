// ffrouter's configuration: flags and their variables (the direct path's --cross-node-path,
// --direct-ports, --direct-seal, --direct-datagrams: defaults, values, refusals at start), and
// the quotas a router fits to its limits (descriptors: FitFdQuota; memory: FitMemoryQuotas,
// with the memory cgroup's limit as CgroupMemoryLimit reads it).
#include "options.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "base/memory_limit.h"

namespace ff::router {
namespace {

// Parses ffrouter's flags (no process settings applied); *code receives the exit code.
std::optional<RouterConfig> Parse(std::vector<std::string> extra, int* code = nullptr) {
  std::vector<std::string> args = {"ffrouter", "--vnet-prefix", "10.244.0.0/16", "--library",
                                   "/dev/null"};
  args.insert(args.end(), extra.begin(), extra.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  int exit_code = 0;
  auto c = ParseOptions(static_cast<int>(argv.size()), argv.data(), &exit_code);
  if (code != nullptr) *code = exit_code;
  return c;
}

TEST(DirectOptionsTest, DirectIsTheDefaultWithEncryptedFramesOnPorts20000To20999) {
  const auto c = Parse({});
  ASSERT_TRUE(c.has_value());
  EXPECT_TRUE(c->direct_path);
  EXPECT_EQ(c->direct_port_lo, 20000);
  EXPECT_EQ(c->direct_port_hi, 20999);
  EXPECT_EQ(c->direct_seal, SealMode::kEncrypt);
  EXPECT_FALSE(c->direct_datagrams) << "UD stays relayed unless asked";
}

TEST(DirectOptionsTest, TheFlagsAreTaken) {
  const auto c = Parse({"--cross-node-path", "direct", "--direct-ports", "31000-31000",
                        "--direct-seal", "authenticate"});
  ASSERT_TRUE(c.has_value());
  EXPECT_TRUE(c->direct_path);
  EXPECT_EQ(c->direct_port_lo, 31000);
  EXPECT_EQ(c->direct_port_hi, 31000);
  EXPECT_EQ(c->direct_seal, SealMode::kAuthenticate);
  EXPECT_FALSE(Parse({"--cross-node-path=relay"})->direct_path);
  EXPECT_TRUE(Parse({"--direct-datagrams"})->direct_datagrams);
}

TEST(DirectOptionsTest, BadValuesStopTheRouterBeforeItStarts) {
  for (const std::vector<std::string>& bad :
       {std::vector<std::string>{"--cross-node-path", "pigeon"},
        {"--direct-seal", "none"},
        {"--direct-ports", "20999-20000"},
        {"--direct-ports", "0-10"},
        {"--direct-ports", "20000-70000"},
        {"--direct-ports", "20000"},
        {"--direct-ports", "20000-20999x"},
        {"--direct-ports", "-5-10"},
        {"--direct-ports", ""}}) {
    int code = 0;
    EXPECT_FALSE(Parse(bad, &code).has_value()) << bad[0] << " " << bad[1];
    EXPECT_NE(code, 0) << bad[0] << " " << bad[1];
  }
}

// The descriptor quota a router applies under its RLIMIT_NOFILE (FitFdQuota): 256 pods at
// the quota, plus the reserve, fit the limit; a quota given is never changed.
TEST(FdQuotaFitTest, TheDefaultStandsWhereItFits) {
  const FdQuotaFit none = FitFdQuota(RLIM_INFINITY, kDefaultPodFds, false);
  EXPECT_EQ(none.quota, kDefaultPodFds);
  EXPECT_TRUE(none.fits);
  const FdQuotaFit big = FitFdQuota(1u << 20, kDefaultPodFds, false);  // systemd's infinity
  EXPECT_EQ(big.quota, kDefaultPodFds);
  EXPECT_TRUE(big.fits);
}

TEST(FdQuotaFitTest, TheDefaultIsLoweredToWhat256PodsFit) {
  const FdQuotaFit f = FitFdQuota(20000, kDefaultPodFds, false);
  EXPECT_EQ(f.quota, (20000 - kFdReserve) / kPodsPerNode);
  EXPECT_TRUE(f.fits);
  EXPECT_LE(kPodsPerNode * f.quota + kFdReserve, 20000u);
  EXPECT_GT(kPodsPerNode * (f.quota + 1) + kFdReserve, 20000u) << "the most that fits";
}

TEST(FdQuotaFitTest, BelowTheFloorTheFloorStandsAndDoesNotFit) {
  const FdQuotaFit f = FitFdQuota(1024, kDefaultPodFds, false);  // a container's 1024
  EXPECT_EQ(f.quota, kMinPodFds);
  EXPECT_FALSE(f.fits) << "the router warns";
}

TEST(FdQuotaFitTest, AGivenQuotaIsKeptAndJudged) {
  EXPECT_EQ(FitFdQuota(20000, 4096, true).quota, 4096u);
  EXPECT_FALSE(FitFdQuota(20000, 4096, true).fits);
  EXPECT_TRUE(FitFdQuota(20000, 70, true).fits);
}

TEST(FdQuotaFitTest, TheRouterKnowsWhetherTheQuotaWasGiven) {
  ASSERT_EQ(::unsetenv("FREEFLOW_MAX_FDS_PER_POD"), 0);
  auto c = Parse({});
  ASSERT_TRUE(c.has_value());
  EXPECT_FALSE(c->quotas_given[static_cast<size_t>(Quota::kFds)]);
  c = Parse({"--max-fds-per-pod", "2048"});
  ASSERT_TRUE(c.has_value());
  EXPECT_TRUE(c->quotas_given[static_cast<size_t>(Quota::kFds)]);
  EXPECT_EQ(c->pod_limits[static_cast<size_t>(Quota::kFds)], 2048u);
  ASSERT_EQ(::setenv("FREEFLOW_MAX_FDS_PER_POD", "300", 1), 0);
  c = Parse({});
  ::unsetenv("FREEFLOW_MAX_FDS_PER_POD");
  ASSERT_TRUE(c.has_value());
  EXPECT_TRUE(c->quotas_given[static_cast<size_t>(Quota::kFds)])
      << "the DaemonSet's variable counts as given";
  EXPECT_EQ(c->pod_limits[static_cast<size_t>(Quota::kFds)], 300u);
}

// The byte quotas a router applies under its memory limit (FitMemoryQuotas): 256 pods stalled
// at their queued, READ and proxy quotas, plus the reserve, fit the limit; quotas given stay.
constexpr uint64_t kMiB = 1u << 20;

uint32_t At(const PodLimits& l, Quota q) { return l[static_cast<size_t>(q)]; }

bool Fits(const PodLimits& l, uint64_t limit) {
  return kPodsPerNode * StalledPodBytes(l) + kMemoryReserve <= limit;
}

TEST(MemoryQuotaFitTest, NoLimitOrAnAmpleOneChangesNothing) {
  const PodLimits defaults = DefaultPodLimits();
  EXPECT_EQ(StalledPodBytes(defaults), 72 * kMiB) << "32 queued, 8 READ, 64 rings of 512 KiB";
  const MemoryQuotaFit none = FitMemoryQuotas(std::nullopt, defaults, {});
  EXPECT_EQ(none.limits, defaults);
  EXPECT_TRUE(none.fits);
  const uint64_t ample = kPodsPerNode * 72 * kMiB + kMemoryReserve;
  const MemoryQuotaFit f = FitMemoryQuotas(ample, defaults, {});
  EXPECT_EQ(f.limits, defaults);
  EXPECT_TRUE(f.fits);
}

TEST(MemoryQuotaFitTest, TheDefaultsAreScaledDownTogetherToWhatFits) {
  const PodLimits defaults = DefaultPodLimits();
  const uint64_t limit = 4096 * kMiB;  // the shipped DaemonSet's
  const MemoryQuotaFit f = FitMemoryQuotas(limit, defaults, {});
  ASSERT_TRUE(f.fits);
  EXPECT_TRUE(Fits(f.limits, limit));
  // 15.5 MiB a pod of 72: each scaled by the same 0.215, rounded down.
  EXPECT_EQ(At(f.limits, Quota::kQueuedBytes), 6u);
  EXPECT_EQ(At(f.limits, Quota::kReadBytes), 1u);
  EXPECT_EQ(At(f.limits, Quota::kProxies), 13u);
  PodLimits others = f.limits;
  for (const Quota q : {Quota::kQueuedBytes, Quota::kReadBytes, Quota::kProxies}) {
    others[static_cast<size_t>(q)] = defaults[static_cast<size_t>(q)];
  }
  EXPECT_EQ(others, defaults) << "only the byte quotas move";
}

TEST(MemoryQuotaFitTest, BelowTheFloorsTheFloorsStandAndDoNotFit) {
  const MemoryQuotaFit f = FitMemoryQuotas(1024 * kMiB, DefaultPodLimits(), {});
  EXPECT_FALSE(f.fits) << "the router warns";
  EXPECT_EQ(At(f.limits, Quota::kQueuedBytes), kMinPodQueuedMiB);
  EXPECT_EQ(At(f.limits, Quota::kReadBytes), kMinPodReadMiB);
  EXPECT_EQ(At(f.limits, Quota::kProxies), kMinPodProxies);
  EXPECT_FALSE(FitMemoryQuotas(kMemoryReserve / 2, DefaultPodLimits(), {}).fits)
      << "a limit below the reserve";
}

TEST(MemoryQuotaFitTest, AGivenQuotaIsKeptAndTheOthersShareWhatIsLeft) {
  PodLimits limits = DefaultPodLimits();
  limits[static_cast<size_t>(Quota::kQueuedBytes)] = 16;
  QuotasGiven given{};
  given[static_cast<size_t>(Quota::kQueuedBytes)] = true;
  const uint64_t limit = 8192 * kMiB;  // 31.5 MiB a pod: 16 given, 15.5 for 40 of defaults
  const MemoryQuotaFit f = FitMemoryQuotas(limit, limits, given);
  ASSERT_TRUE(f.fits);
  EXPECT_TRUE(Fits(f.limits, limit));
  EXPECT_EQ(At(f.limits, Quota::kQueuedBytes), 16u);
  EXPECT_EQ(At(f.limits, Quota::kReadBytes), 3u);
  EXPECT_EQ(At(f.limits, Quota::kProxies), 24u);
  // Every byte quota given and too high: kept, and judged.
  given.fill(true);
  const MemoryQuotaFit all = FitMemoryQuotas(limit, DefaultPodLimits(), given);
  EXPECT_EQ(all.limits, DefaultPodLimits());
  EXPECT_FALSE(all.fits);
}

TEST(MemoryQuotaFitTest, TheRouterKnowsWhichByteQuotasWereGiven) {
  for (const char* env : {"FREEFLOW_MAX_QUEUED_MIB_PER_POD", "FREEFLOW_MAX_READ_MIB_PER_POD",
                          "FREEFLOW_MAX_PROXIES_PER_POD"}) {
    ASSERT_EQ(::unsetenv(env), 0);
  }
  auto c = Parse({"--max-queued-mib-per-pod", "16"});
  ASSERT_TRUE(c.has_value());
  EXPECT_TRUE(c->quotas_given[static_cast<size_t>(Quota::kQueuedBytes)]);
  EXPECT_FALSE(c->quotas_given[static_cast<size_t>(Quota::kReadBytes)]);
  EXPECT_FALSE(c->quotas_given[static_cast<size_t>(Quota::kProxies)]);
  EXPECT_EQ(At(c->pod_limits, Quota::kQueuedBytes), 16u);
}

// A cgroup tree under a folder of the test's: CgroupMemoryLimit reads it as /sys/fs/cgroup.
class CgroupTree : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ff-cgroup-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    root_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(root_, ec);
  }
  void Write(const std::string& dir, const std::string& file, const std::string& value) {
    std::filesystem::create_directories(root_ + "/" + dir);
    std::ofstream(root_ + "/" + dir + "/" + file) << value << "\n";
  }
  std::string root_;
};

TEST_F(CgroupTree, V1TheSmallestLimitOfTheCgroupAndItsAncestors) {
  const char* file = "memory.limit_in_bytes";
  Write("memory", file, "9223372036854771712");  // v1's "no limit"
  Write("memory/kubepods", file, "9223372036854771712");
  Write("memory/kubepods/pod1", file, "2147483648");
  Write("memory/kubepods/pod1/ctr", file, "4294967296");
  Write("unified", "memory.max", "1048576");  // a hybrid host's v2 mount: not the controller
  const std::string self = "4:memory:/kubepods/pod1/ctr\n1:cpu:/\n0::/\n";
  EXPECT_EQ(CgroupMemoryLimit(self, root_), 2147483648u);
  EXPECT_EQ(CgroupMemoryLimit("4:memory:/kubepods\n0::/\n", root_), std::nullopt);
}

TEST_F(CgroupTree, V2MemoryMaxOfTheCgroupAndItsAncestors) {
  Write("kubepods.slice/pod1/ctr", "memory.max", "max");
  Write("kubepods.slice/pod1", "memory.max", "1073741824");
  Write("kubepods.slice", "memory.max", "max");
  EXPECT_EQ(CgroupMemoryLimit("0::/kubepods.slice/pod1/ctr\n", root_), 1073741824u);
  EXPECT_EQ(CgroupMemoryLimit("0::/kubepods.slice\n", root_), std::nullopt);
}

TEST_F(CgroupTree, InAContainerTheMountIsTheContainersCgroup) {
  // Without a cgroup namespace the kernel names the host's path, which the container's own
  // mount does not hold; the mount's root is the container's cgroup.
  Write("memory", "memory.limit_in_bytes", "536870912");
  EXPECT_EQ(CgroupMemoryLimit("9:memory:/kubepods/pod1/ctr\n", root_), 536870912u);
  Write("", "memory.max", "268435456");
  EXPECT_EQ(CgroupMemoryLimit("0::/kubepods.slice/pod1/ctr\n", root_), 268435456u);
}

TEST_F(CgroupTree, WhatCannotBeReadIsNoLimit) {
  Write("memory/a", "memory.limit_in_bytes", "lots");
  EXPECT_EQ(CgroupMemoryLimit("4:memory:/a\n", root_), std::nullopt);
  EXPECT_EQ(CgroupMemoryLimit("", root_), std::nullopt);
  EXPECT_EQ(CgroupMemoryLimit("garbage\n", root_), std::nullopt);
  EXPECT_EQ(CgroupMemoryLimit("4:memory:/../../etc\n", root_), std::nullopt);
}
}  // namespace
}  // namespace ff::router
