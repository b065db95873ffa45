// Pods' names from the container runtime (identity/pod_names.h, docs/metrics.md): a fake
// runtime serves the two CRI calls the router makes on a Unix socket. The router names a pod
// by the address the runtime gives its sandbox, forgets a sandbox that went, names a new one
// after a refresh, names nothing (and costs nothing) when the runtime is not there, and a
// scrape and ffctl's answer carry the name.
#include "identity/pod_names.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <thread>

#include "cri_runtime.grpc.pb.h"
#include "harness.h"
#include "scrape.h"

namespace ff::router::test {
namespace {

struct Sandbox {
  std::string id, ns, name, ip;
};

class FakeRuntime final : public runtime::v1::RuntimeService::Service {
 public:
  FakeRuntime() {
    char dir[] = "/tmp/ff-cri-XXXXXX";
    EXPECT_NE(::mkdtemp(dir), nullptr);
    dir_ = dir;
    grpc::ServerBuilder b;
    b.AddListeningPort("unix:" + socket(), grpc::InsecureServerCredentials());
    b.RegisterService(this);
    server_ = b.BuildAndStart();
    EXPECT_NE(server_, nullptr);
  }
  ~FakeRuntime() override {
    server_->Shutdown();
    std::filesystem::remove_all(dir_);
  }
  std::string socket() const { return dir_ + "/cri.sock"; }
  void Set(std::vector<Sandbox> sandboxes) {
    std::lock_guard<std::mutex> lock(mu_);
    sandboxes_ = std::move(sandboxes);
  }

  grpc::Status ListPodSandbox(grpc::ServerContext*, const runtime::v1::ListPodSandboxRequest* req,
                              runtime::v1::ListPodSandboxResponse* out) override {
    EXPECT_TRUE(req->filter().has_state()) << "only ready sandboxes are asked for";
    std::lock_guard<std::mutex> lock(mu_);
    for (const Sandbox& s : sandboxes_) {
      runtime::v1::PodSandbox* item = out->add_items();
      item->set_id(s.id);
      item->mutable_metadata()->set_namespace_(s.ns);
      item->mutable_metadata()->set_name(s.name);
    }
    return grpc::Status::OK;
  }
  grpc::Status PodSandboxStatus(grpc::ServerContext*,
                                const runtime::v1::PodSandboxStatusRequest* req,
                                runtime::v1::PodSandboxStatusResponse* out) override {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Sandbox& s : sandboxes_) {
      if (s.id != req->pod_sandbox_id()) continue;
      out->mutable_status()->set_id(s.id);
      out->mutable_status()->mutable_network()->set_ip(s.ip);
      return grpc::Status::OK;
    }
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "no such sandbox");
  }

 private:
  std::string dir_;
  std::unique_ptr<grpc::Server> server_;
  std::mutex mu_;
  std::vector<Sandbox> sandboxes_;
};

// Waits (at most 5 s) until `names` says `want` for `ip`.
bool WaitForName(const PodNames& names, uint32_t ip, std::optional<PodNames::Name> want) {
  for (int i = 0; i < 500; ++i) {
    if (names.Find(ip) == want) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

TEST(PodNamesTest, APodIsNamedByTheAddressTheRuntimeGivesItsSandbox) {
  FakeRuntime runtime;
  runtime.Set({{"a1", "team-a", "trainer-0", "10.0.0.1"},
               {"b1", "team-b", "v6-only", "fd00::1"},
               {"c1", "team-c", "no-network", ""}});
  PodNames names(runtime.socket());
  EXPECT_TRUE(WaitForName(names, Ip("10.0.0.1"), PodNames::Name{"team-a", "trainer-0"}));
  EXPECT_EQ(names.Find(Ip("10.0.0.2")), std::nullopt);
  EXPECT_EQ(names.failures(), 0u);
}

TEST(PodNamesTest, ASandboxThatWentIsForgottenAndANewOneIsNamedAfterARefresh) {
  FakeRuntime runtime;
  runtime.Set({{"a1", "team-a", "trainer-0", "10.0.0.1"}});
  PodNames names(runtime.socket());
  ASSERT_TRUE(WaitForName(names, Ip("10.0.0.1"), PodNames::Name{"team-a", "trainer-0"}));
  runtime.Set({{"a2", "team-a", "trainer-1", "10.0.0.2"}});
  names.Refresh();
  EXPECT_TRUE(WaitForName(names, Ip("10.0.0.2"), PodNames::Name{"team-a", "trainer-1"}));
  EXPECT_EQ(names.Find(Ip("10.0.0.1")), std::nullopt);
}

TEST(PodNamesTest, ARuntimeThatIsNotThereNamesNothing) {
  const auto start = std::chrono::steady_clock::now();
  {
    PodNames names("/nonexistent/cri.sock");
    for (int i = 0; i < 500 && names.failures() == 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_GE(names.failures(), 1u);
    EXPECT_EQ(names.Find(Ip("10.0.0.1")), std::nullopt);
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start,
            std::chrono::milliseconds(2 * PodNames::kCallTimeoutMs + 1000));
}

TEST(PodNamesTest, AScrapeAndFfctlCarryThePodsName) {
  FakeRuntime runtime;
  TestRouter::Options o;
  o.metrics_address = "127.0.0.1:0";
  o.cri_endpoint = runtime.socket();
  TestRouter router(o);
  RawPod pod(router, Ip("10.0.0.1"));
  ASSERT_EQ(pod.Hello(), 0);
  ASSERT_EQ(pod.CreateQp(IBV_QPT_RC).status, 0);
  // The pod started after the router last asked: the scrape that finds it unnamed asks again.
  runtime.Set({{"a1", "team-a", "trainer-0", "10.0.0.1"}});
  const std::string series =
      "freeflow_router_pod_info{address=\"10.0.0.1\",namespace=\"team-a\",pod=\"trainer-0\"}";
  std::string text;
  for (int i = 0; i < 500; ++i) {
    text = ff::test::HttpRequest(router.MetricsPort(), "GET", "/metrics").body;
    if (ff::test::SampleValue(text, series) == 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(ff::test::SampleValue(text, series), 1) << text;
  std::string report;
  EXPECT_EQ(ff::test::PromtoolCheck(text, &report), 0) << report << text;
  // ffctl pods, as the node's admin runs it.
  const std::string command = std::string(FFCTL_BINARY) + " --dir " + router.dir() + " pods";
  std::FILE* p = ::popen(command.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string table;
  char buf[1024];
  while (std::fgets(buf, sizeof(buf), p) != nullptr) table += buf;
  EXPECT_EQ(::pclose(p), 0) << table;
  EXPECT_NE(table.find("10.0.0.1  team-a/trainer-0"), std::string::npos) << table;
}

}  // namespace
}  // namespace ff::router::test
