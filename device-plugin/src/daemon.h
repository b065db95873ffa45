// The daemon's lifecycle and main loop.
//
// run() performs, in order: read config -> validate -> discover -> serve ->
// register, failing fast (exit code 2 for config, 1 for environment) with a
// message naming the problem. It then loops until SIGTERM/SIGINT or
// request_stop(): inotify events (kubelet restarts), signals (SIGHUP reload),
// periodic health rescans and registration retries. Everything in the loop
// runs on the calling thread; only request_stop() may be called from others.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "backend.h"
#include "config.h"
#include "freeflow/metrics/http_endpoint.h"
#include "metrics.h"
#include "plugin_server.h"
#include "registration.h"
#include "watcher.h"

namespace ff::dp {

enum class RegistrationMode { kKubelet, kPluginsRegistry };

struct DaemonOptions {
  std::string config_path;
  std::string kubelet_dir = "/var/lib/kubelet/device-plugins";
  std::string sysfs_root = "/sys";
  std::string dev_root = "/dev";
  std::string host_dev_root = "/dev";
  std::string metrics_address;  // empty: no metrics endpoint
  std::string cdi_dir;          // empty: no CDI specs
  bool cdi_only = false;
  RegistrationMode registration = RegistrationMode::kKubelet;
  std::string registry_dir = "/var/lib/kubelet/plugins_registry";
  std::chrono::milliseconds register_timeout{1000};
};

class Daemon {
 public:
  // registrar/watcher default to the real gRPC client and inotify.
  explicit Daemon(DaemonOptions opts, std::unique_ptr<KubeletRegistrar> registrar = nullptr,
                  std::unique_ptr<DirWatcher> watcher = nullptr);
  ~Daemon();

  // signal_fd: a signalfd delivering SIGHUP/SIGTERM/SIGINT, or -1.
  int run(int signal_fd);
  void request_stop();

 private:
  struct Slot {
    std::unique_ptr<ResourcePlugin> plugin;
    bool need_register = false;
    std::chrono::steady_clock::time_point next_attempt{};
    std::chrono::milliseconds backoff{50};
  };

  bool check_environment(std::string* error) const;
  std::vector<Slot> build(const PluginConfig& cfg);
  bool start_all(std::vector<Slot>* slots, std::string* error);
  void stop_all();
  void reload();
  void handle_events();
  void ensure_sockets();
  void try_registrations();
  void rescan();
  void write_cdi(const ResourcePlugin& plugin);
  std::string socket_dir() const;
  void mark_for_registration(Slot* slot);

  DaemonOptions opts_;
  std::unique_ptr<KubeletRegistrar> registrar_;
  std::unique_ptr<DirWatcher> watcher_;
  Metrics metrics_;
  std::unique_ptr<metrics::HttpEndpoint> metrics_server_;
  PluginConfig config_;
  std::vector<Slot> slots_;
  int stop_fd_ = -1;
  bool stop_ = false;
  bool dir_lost_ = false;
};

}  // namespace ff::dp
