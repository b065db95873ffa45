// End-to-end figures for rdma-device-plugin, each run against a fresh daemon
// and kubelet stand-in over fixture sysfs trees:
//   Allocate round trip (p50, p99) through the plugin's gRPC Unix socket,
//   health change -> ListAndWatch update, kubelet restart -> re-registration,
//   daemon RSS. Prints every run, then median [min, max] over runs.
//
//   device_plugin_bench [runs=5] [allocations=2000]
#include <fmt/format.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "kubelet_standin.h"
#include "sysfs_fixture.h"

namespace fs = std::filesystem;
using namespace ff::dp::testing;
using std::chrono::duration;
using std::chrono::milliseconds;

namespace {

double ms(Clock::duration d) { return duration<double, std::milli>(d).count(); }

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

struct RunResult {
  double alloc_p50_us = -1, alloc_p99_us = -1, health_ms = -1, rereg_ms = -1, rss_mb = -1;
};

bool all_health(const v1beta1::ListAndWatchResponse& l, const char* h) {
  if (l.devices_size() == 0) return false;
  for (const auto& d : l.devices())
    if (d.health() != h) return false;
  return true;
}

RunResult one_run(int allocations) {
  RunResult out;
  const std::string root = make_temp_dir("bench");
  const std::string kdir = root + "/device-plugins";
  fs::create_directories(kdir);
  fs::create_directories(root + "/freeflow");
  {
    SysfsFixture sysfs;
    SysfsFixture::dual_port_connectx(&sysfs);
    nlohmann::json cfg = {{"configList",
                           {{{"resourceName", "hca"}, {"rdmaHcaMax", 1000}},
                            {{"resourceName", "vrdma"},
                             {"mode", "virtual"},
                             {"virtualDevices", 100},
                             {"freeflowDir", root + "/freeflow"}}}}};
    std::ofstream(root + "/config.json") << cfg.dump();
    KubeletStandIn kubelet(kdir);
    kubelet.start();
    DaemonProcess daemon(FFDP_BINARY,
                         {"--config", root + "/config.json", "--kubelet-dir", kdir, "--sysfs-root",
                          sysfs.sys_root(), "--dev-root", sysfs.dev_root(), "--log-level", "warn"},
                         root + "/daemon.log");
    const char* hca = "rdma/hca";
    if (!kubelet.wait_registration(hca, 1, milliseconds(5000)) ||
        !kubelet.wait_list(
            hca, [](auto& l) { return all_health(l, "Healthy"); }, milliseconds(5000))) {
      fmt::print(stderr, "daemon did not come up; log:\n{}\n", read_text(root + "/daemon.log"));
      fs::remove_all(root);
      return out;
    }

    // Allocate round trip on one persistent channel, as kubelet keeps one.
    auto stub = kubelet.plugin(hca);
    v1beta1::AllocateRequest req;
    req.add_container_requests()->add_devices_ids("hca-7");
    std::vector<double> lat;
    lat.reserve(static_cast<size_t>(allocations));
    for (int i = 0; i < allocations + 100; ++i) {
      v1beta1::AllocateResponse resp;
      grpc::ClientContext ctx;
      auto t0 = Clock::now();
      auto st = stub->Allocate(&ctx, req, &resp);
      auto t1 = Clock::now();
      if (!st.ok()) break;
      if (i >= 100) lat.push_back(duration<double, std::micro>(t1 - t0).count());
    }
    out.alloc_p50_us = percentile(lat, 0.50);
    out.alloc_p99_us = percentile(lat, 0.99);

    // Health change: port down then up, 3 times each; median of the 6.
    std::vector<double> health;
    for (int i = 0; i < 3; ++i) {
      for (int state : {1, 4}) {
        auto t0 = Clock::now();
        sysfs.set_port_state("mlx5_0", 1, state);
        const char* want = state == 4 ? "Healthy" : "Unhealthy";
        auto u = kubelet.wait_list(
            hca, [&](auto& l) { return all_health(l, want); }, milliseconds(5000));
        if (u) health.push_back(ms(u->at - t0));
      }
    }
    out.health_ms = percentile(health, 0.5);

    // Kubelet restart -> every resource registered again; median of 5.
    std::vector<double> rereg;
    for (int i = 0; i < 5; ++i) {
      auto created = kubelet.restart();
      double worst = -1;
      for (const char* r : {"rdma/hca", "freeflow/vrdma"}) {
        auto reg = kubelet.wait_registration_since(r, created, milliseconds(5000));
        if (!reg) {
          worst = -1;
          break;
        }
        worst = std::max(worst, ms(reg->at - created));
      }
      if (worst >= 0) rereg.push_back(worst);
      std::this_thread::sleep_for(milliseconds(100));
    }
    out.rereg_ms = percentile(rereg, 0.5);
    out.rss_mb = static_cast<double>(daemon.rss_kb()) / 1024.0;
    daemon.stop();
  }
  fs::remove_all(root);
  return out;
}

void summary(const char* name, const char* unit, std::vector<double> v, const char* target) {
  std::sort(v.begin(), v.end());
  fmt::print("{:<32} median {:8.3f} {}  [min {:.3f}, max {:.3f}]  target {}\n", name,
             percentile(v, 0.5), unit, v.front(), v.back(), target);
}

}  // namespace

int main(int argc, char** argv) {
  int runs = argc > 1 ? std::max(1, std::atoi(argv[1])) : 5;
  int allocations = argc > 2 ? std::max(10, std::atoi(argv[2])) : 2000;
  std::vector<RunResult> results;
  for (int r = 0; r < runs; ++r) {
    auto res = one_run(allocations);
    fmt::print(
        "run {}: allocate p50 {:.1f} us p99 {:.1f} us | health {:.1f} ms | re-register {:.1f} ms | "
        "rss {:.1f} MB\n",
        r + 1, res.alloc_p50_us, res.alloc_p99_us, res.health_ms, res.rereg_ms, res.rss_mb);
    if (res.alloc_p50_us < 0) return 1;
    results.push_back(res);
  }
  auto col = [&](auto f) {
    std::vector<double> v;
    for (const auto& r : results) v.push_back(f(r));
    return v;
  };
  fmt::print("\nover {} runs ({} Allocate calls each):\n", runs, allocations);
  summary("Allocate p50", "us", col([](auto& r) { return r.alloc_p50_us; }), "-");
  summary("Allocate p99", "us", col([](auto& r) { return r.alloc_p99_us; }), "< 1000 us");
  summary("health change -> ListAndWatch", "ms", col([](auto& r) { return r.health_ms; }),
          "< 2000 ms");
  summary("kubelet restart -> registered", "ms", col([](auto& r) { return r.rereg_ms; }),
          "< 1000 ms");
  summary("daemon RSS", "MB", col([](auto& r) { return r.rss_mb; }), "< 20 MB");
  return 0;
}
