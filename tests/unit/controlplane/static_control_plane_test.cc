// The static control plane end to end: a real file in a temporary directory, rewritten in
// place, replaced by an atomic rename, and swapped the way kubelet updates a ConfigMap.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "freeflow/controlplane.h"
#include "freeflow/ipv4.h"
#include "log_capture.h"

namespace ff::cp {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

uint32_t Ip(const char* text) { return *ParseIpv4(text); }

const Endpoint kSelf{"node-a", 0xac1f0002, 7471};

// A file with node-a (10.244.1.0/24) and node-b (10.244.2.0/24, at `b_address`).
std::string TwoNodes(const char* b_address = "172.31.0.3") {
  return std::string(R"({"nodes": [
    {"name": "node-a", "address": "172.31.0.2", "port": 7471, "podCIDRs": ["10.244.1.0/24"]},
    {"name": "node-b", "address": ")") +
         b_address + R"(", "port": 7471, "podCIDRs": ["10.244.2.0/24"]}],
    "pods": {"10.244.3.7": "node-b"}})";
}

void Write(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  ASSERT_TRUE(out.good()) << path;
}

// Polls `done` every 10 ms for at most `limit`.
template <typename F>
bool WaitFor(F done, std::chrono::milliseconds limit = 3000ms) {
  for (auto end = std::chrono::steady_clock::now() + limit; std::chrono::steady_clock::now() < end;
       std::this_thread::sleep_for(10ms))
    if (done()) return true;
  return done();
}

class StaticControlPlaneTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ff-cp-static-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    file_ = dir_ / "nodes.json";
  }
  void TearDown() override {
    cp_.reset();
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  // Creates and starts a control plane on `path` (default: file_). Asserts success.
  void Start(const fs::path& path = {}) {
    std::string error;
    cp_ = MakeControlPlane("static:" + (path.empty() ? file_ : path).string(), kSelf, {}, &error);
    ASSERT_NE(cp_, nullptr) << error;
    cp_->OnChange([this] { ++changes_; });
    ASSERT_TRUE(cp_->Start(&error)) << error;
    EXPECT_TRUE(cp_->Healthy());
  }

  // Creates a control plane on file_ whose Start() must fail; its error.
  std::string StartError() {
    std::string error;
    cp_ = MakeControlPlane("static:" + file_.string(), kSelf, {}, &error);
    if (!cp_) return "MakeControlPlane: " + error;
    EXPECT_FALSE(cp_->Start(&error));
    EXPECT_FALSE(cp_->Healthy());
    return error;
  }

  std::optional<uint32_t> NodeBAddress() {
    auto e = cp_->Lookup(Ip("10.244.2.9"));
    if (!e) return std::nullopt;
    return e->address;
  }

  fs::path dir_, file_;
  std::unique_ptr<ControlPlane> cp_;
  std::atomic<int> changes_{0};
};

TEST_F(StaticControlPlaneTest, ServesTheFile) {
  Write(file_, TwoNodes());
  Start();
  EXPECT_EQ(cp_->Lookup(Ip("10.244.2.9")), (Endpoint{"node-b", Ip("172.31.0.3"), 7471}));
  EXPECT_EQ(cp_->Lookup(Ip("10.244.3.7")), (Endpoint{"node-b", Ip("172.31.0.3"), 7471}));
  EXPECT_EQ(cp_->Lookup(Ip("10.244.1.9")), kSelf);
  EXPECT_EQ(cp_->Lookup(Ip("10.244.4.1")), std::nullopt);
  ASSERT_EQ(cp_->Nodes().size(), 1u);
  EXPECT_EQ(cp_->Nodes()[0].node, "node-b");
}

TEST_F(StaticControlPlaneTest, PublishedAddressesResolveToSelf) {
  Write(file_, TwoNodes());
  Start();
  cp_->Withdraw(Ip("10.9.9.9"));  // unknown: no-op
  cp_->Publish(Ip("10.9.9.9"));
  cp_->Publish(Ip("10.9.9.9"));
  cp_->Publish(Ip("10.244.2.5"));  // a pod of node-b's range that moved here
  EXPECT_EQ(cp_->Lookup(Ip("10.9.9.9")), kSelf);
  EXPECT_EQ(cp_->Lookup(Ip("10.244.2.5")), kSelf);
  cp_->Withdraw(Ip("10.244.2.5"));
  EXPECT_EQ(cp_->Lookup(Ip("10.244.2.5"))->node, "node-b");
  cp_->Withdraw(Ip("10.9.9.9"));
  EXPECT_EQ(cp_->Lookup(Ip("10.9.9.9")), std::nullopt);
  EXPECT_EQ(changes_, 0);
}

TEST_F(StaticControlPlaneTest, BadFileAtStartNamesTheField) {
  Write(file_, R"({"nodes": [{"name": "node-b", "address": "172.31.0.3", "port": 7471,
                              "podCIDRs": ["10.244.2/24"]}]})");
  std::string error;
  cp_ = MakeControlPlane("static:" + file_.string(), kSelf, {}, &error);
  ASSERT_NE(cp_, nullptr) << error;
  EXPECT_FALSE(cp_->Start(&error));
  EXPECT_EQ(error, "control plane file " + file_.string() +
                       ": nodes[0].podCIDRs[0]: \"10.244.2/24\" is not an IPv4 prefix (like "
                       "\"10.244.1.0/24\")");
  EXPECT_FALSE(cp_->Healthy());
}

TEST_F(StaticControlPlaneTest, ReloadsOnRewriteInPlace) {
  Write(file_, TwoNodes());
  Start();
  Write(file_, TwoNodes("172.31.0.30"));
  EXPECT_TRUE(WaitFor([&] { return NodeBAddress() == Ip("172.31.0.30"); }));
  EXPECT_TRUE(WaitFor([&] { return changes_ == 1; }));
}

TEST_F(StaticControlPlaneTest, ReloadsOnAtomicRename) {
  Write(file_, TwoNodes());
  Start();
  Write(dir_ / ".nodes.json.tmp", TwoNodes("172.31.0.31"));
  fs::rename(dir_ / ".nodes.json.tmp", file_);
  EXPECT_TRUE(WaitFor([&] { return NodeBAddress() == Ip("172.31.0.31"); }));
  EXPECT_TRUE(WaitFor([&] { return changes_ == 1; }));
}

TEST_F(StaticControlPlaneTest, ReloadsOnConfigMapSymlinkSwap) {
  // kubelet's layout: nodes.json -> ..data/nodes.json, ..data -> ..<timestamp>/.
  fs::create_directory(dir_ / "..v1");
  Write(dir_ / "..v1" / "nodes.json", TwoNodes());
  fs::create_directory_symlink("..v1", dir_ / "..data");
  fs::create_symlink("..data/nodes.json", file_);
  Start();
  EXPECT_EQ(NodeBAddress(), Ip("172.31.0.3"));

  fs::create_directory(dir_ / "..v2");
  Write(dir_ / "..v2" / "nodes.json", TwoNodes("172.31.0.32"));
  fs::create_directory_symlink("..v2", dir_ / "..data_tmp");
  fs::rename(dir_ / "..data_tmp", dir_ / "..data");
  fs::remove_all(dir_ / "..v1");
  EXPECT_TRUE(WaitFor([&] { return NodeBAddress() == Ip("172.31.0.32"); }));
  EXPECT_TRUE(WaitFor([&] { return changes_ == 1; }));
}

TEST_F(StaticControlPlaneTest, BadReloadKeepsThePreviousMapping) {
  Write(file_, TwoNodes());
  Start();
  Write(file_, R"({"nodes": [{"name": "node-b"}]})");
  // Give the watcher time to see and refuse it; nothing may change meanwhile.
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(NodeBAddress(), Ip("172.31.0.3"));
  EXPECT_TRUE(cp_->Healthy());
  EXPECT_EQ(changes_, 0);
  // A good file afterwards is taken.
  Write(file_, TwoNodes("172.31.0.33"));
  EXPECT_TRUE(WaitFor([&] { return NodeBAddress() == Ip("172.31.0.33"); }));
}

TEST_F(StaticControlPlaneTest, DeletedFileKeepsTheMappingAndIsPickedUpWhenBack) {
  Write(file_, TwoNodes());
  Start();
  fs::remove(file_);
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(NodeBAddress(), Ip("172.31.0.3"));
  Write(file_, TwoNodes("172.31.0.34"));
  EXPECT_TRUE(WaitFor([&] { return NodeBAddress() == Ip("172.31.0.34"); }));
}

TEST_F(StaticControlPlaneTest, UnrelatedFilesInTheDirectoryChangeNothing) {
  Write(file_, TwoNodes());
  Start();
  Write(dir_ / "other.txt", "hello");
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(changes_, 0);
}

TEST_F(StaticControlPlaneTest, RelativePath) {
  Write(file_, TwoNodes());
  const auto old = fs::current_path();
  fs::current_path(dir_);
  Start("nodes.json");
  fs::current_path(old);
  EXPECT_EQ(NodeBAddress(), Ip("172.31.0.3"));
}

TEST_F(StaticControlPlaneTest, ItsNameAtAnotherAddressRefusesTheStart) {
  // node-a listed at 172.31.0.9: this router (node-a at 172.31.0.2) must not start.
  Write(file_, R"({"nodes": [{"name": "node-a", "address": "172.31.0.9", "port": 7471}]})");
  const std::string error = StartError();
  EXPECT_TRUE(error.starts_with("control plane file " + file_.string() +
                                ": it lists node \"node-a\" at 172.31.0.9:7471, but this router "
                                "serves node links on 172.31.0.2:7471"))
      << error;
  EXPECT_NE(error.find("--node-name"), std::string::npos) << error;
}

TEST_F(StaticControlPlaneTest, ItsAddressUnderAnotherNameRefusesTheStart) {
  Write(file_, R"({"nodes": [{"name": "node-x", "address": "172.31.0.2", "port": 7471}]})");
  const std::string error = StartError();
  EXPECT_NE(error.find("start this router with --node-name node-x"), std::string::npos) << error;
}

TEST_F(StaticControlPlaneTest, AnUnlistedNodeStartsWithAWarning) {
  ff::testing::LogCapture log;
  Write(file_, R"({"nodes": [{"name": "node-b", "address": "172.31.0.3", "port": 7471,
                              "podCIDRs": ["10.244.2.0/24"]}]})");
  Start();
  EXPECT_EQ(NodeBAddress(), Ip("172.31.0.3"));
  EXPECT_EQ(log.Count({"node \"node-a\" is not in it"}), 1);
}

TEST_F(StaticControlPlaneTest, AReloadThatMisnamesThisRouterIsLoggedOnceAndChangesNothing) {
  ff::testing::LogCapture log;
  Write(file_, TwoNodes());
  Start();
  cp_->Publish(Ip("10.244.1.5"));
  const std::string misnamed = R"({"nodes": [
    {"name": "node-a", "address": "172.31.0.9", "port": 7471, "podCIDRs": ["10.244.1.0/24"]},
    {"name": "node-b", "address": ")";
  Write(file_, misnamed + R"(172.31.0.33", "port": 7471, "podCIDRs": ["10.244.2.0/24"]}]})");
  EXPECT_TRUE(WaitFor([&] { return NodeBAddress() == Ip("172.31.0.33"); }));
  Write(file_, misnamed + R"(172.31.0.34", "port": 7471, "podCIDRs": ["10.244.2.0/24"]}]})");
  EXPECT_TRUE(WaitFor([&] { return NodeBAddress() == Ip("172.31.0.34"); }));
  // This router's pods and node stay its own; the mistake is said once, not per reload.
  EXPECT_EQ(cp_->Lookup(Ip("10.244.1.5")), kSelf);
  EXPECT_EQ(cp_->Lookup(Ip("10.244.1.6")), kSelf);
  EXPECT_EQ(log.Count({"it lists node \"node-a\" at 172.31.0.9:7471", "keeps its own address"}), 1);
}

}  // namespace
}  // namespace ff::cp
