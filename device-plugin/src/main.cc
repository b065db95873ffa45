// rdma-device-plugin: kubelet device plugin for RDMA (see docs/device-plugin.md).
// Thin on purpose: flags -> DaemonOptions, signals -> signalfd, then Daemon::run.
#include <malloc.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include "daemon.h"
#include "freeflow/version.h"

int main(int argc, char** argv) {
  // gRPC runs a handful of threads; per-thread malloc arenas would multiply
  // resident memory for no gain in a daemon this quiet.
  mallopt(M_ARENA_MAX, 2);
  ff::dp::DaemonOptions opts;
  std::string log_level = "info";
  std::string registration = "kubelet";
  int register_timeout_ms = static_cast<int>(opts.register_timeout.count());

  CLI::App app{"Kubernetes device plugin for RDMA HCAs, SR-IOV VFs and freeflow virtual devices"};
  app.set_version_flag("--version", ff::VersionLine("rdma-device-plugin"));
  app.add_option("--config", opts.config_path, "JSON config file")->required();
  app.add_option("--kubelet-dir", opts.kubelet_dir, "kubelet device-plugin folder")
      ->capture_default_str();
  app.add_option("--sysfs-root", opts.sysfs_root, "where sysfs is mounted")->capture_default_str();
  app.add_option("--dev-root", opts.dev_root, "where /dev is mounted (for existence checks)")
      ->capture_default_str();
  app.add_option("--host-dev-root", opts.host_dev_root,
                 "the node's /dev, as written into DeviceSpecs")
      ->capture_default_str();
  app.add_option("--registration", registration, "kubelet (Register call) or plugins-registry")
      ->check(CLI::IsMember({"kubelet", "plugins-registry"}))
      ->capture_default_str();
  app.add_option("--plugins-registry-dir", opts.registry_dir, "kubelet plugin watcher folder")
      ->capture_default_str();
  app.add_option("--register-timeout-ms", register_timeout_ms, "deadline of one Register call")
      ->check(CLI::Range(50, 60000))
      ->capture_default_str();
  app.add_option("--metrics-address", opts.metrics_address,
                 "host:port for Prometheus /metrics (off if empty)");
  app.add_option("--cdi-dir", opts.cdi_dir,
                 "write CDI specs here and name CDI devices in Allocate");
  app.add_flag("--cdi-only", opts.cdi_only, "with --cdi-dir: Allocate returns only cdi_devices");
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error, critical")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"}))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  spdlog::set_level(spdlog::level::from_str(log_level));
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");
  opts.registration = registration == "kubelet" ? ff::dp::RegistrationMode::kKubelet
                                                : ff::dp::RegistrationMode::kPluginsRegistry;
  opts.register_timeout = std::chrono::milliseconds(register_timeout_ms);

  // Block the signals in every thread (gRPC's included) and read them from a
  // signalfd in the main loop, so handlers never run inside library code.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGHUP);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  int sfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
  if (sfd < 0) {
    spdlog::critical("signalfd failed");
    return 1;
  }
  signal(SIGPIPE, SIG_IGN);

  ff::dp::Daemon daemon(opts);
  int rc = daemon.run(sfd);
  close(sfd);
  return rc;
}
