#include "daemon.h"

#include <poll.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cdi.h"
#include "freeflow/tunables.h"

namespace ff::dp {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

bool is_dir(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::string cdi_file_name(const ResourceConfig& rc) {
  std::string s = "freeflow-" + rc.resource_prefix + "-" + rc.resource_name + ".json";
  for (char& c : s)
    if (c == '/') c = '_';
  return s;
}

}  // namespace

Daemon::Daemon(DaemonOptions opts, std::unique_ptr<KubeletRegistrar> registrar,
               std::unique_ptr<DirWatcher> watcher)
    : opts_(std::move(opts)), registrar_(std::move(registrar)), watcher_(std::move(watcher)) {
  if (!registrar_)
    registrar_ = std::make_unique<GrpcKubeletRegistrar>(opts_.kubelet_dir + "/kubelet.sock",
                                                        opts_.register_timeout);
  if (!watcher_) watcher_ = std::make_unique<InotifyWatcher>();
  stop_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
}

Daemon::~Daemon() {
  stop_all();
  if (stop_fd_ >= 0) ::close(stop_fd_);
}

void Daemon::request_stop() {
  uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(stop_fd_, &one, sizeof(one));
}

std::string Daemon::socket_dir() const {
  return opts_.registration == RegistrationMode::kKubelet ? opts_.kubelet_dir : opts_.registry_dir;
}

bool Daemon::check_environment(std::string* error) const {
  if (!is_dir(opts_.kubelet_dir)) {
    *error = "kubelet device-plugin folder '" + opts_.kubelet_dir +
             "' does not exist (is kubelet running, is the hostPath mounted? see --kubelet-dir)";
    return false;
  }
  if (opts_.registration == RegistrationMode::kPluginsRegistry && !is_dir(opts_.registry_dir)) {
    *error = "plugins_registry folder '" + opts_.registry_dir +
             "' does not exist (see --plugins-registry-dir)";
    return false;
  }
  if (!is_dir(opts_.sysfs_root)) {
    *error = "sysfs root '" + opts_.sysfs_root + "' does not exist (see --sysfs-root)";
    return false;
  }
  if (!opts_.cdi_dir.empty() && !is_dir(opts_.cdi_dir)) {
    *error = "CDI folder '" + opts_.cdi_dir + "' does not exist (see --cdi-dir)";
    return false;
  }
  return true;
}

std::vector<Daemon::Slot> Daemon::build(const PluginConfig& cfg) {
  BackendContext ctx;
  ctx.sys = std::make_shared<RootedFileSystem>(opts_.sysfs_root);
  ctx.dev = std::make_shared<RootedFileSystem>(opts_.dev_root);
  ctx.host_dev_root = opts_.host_dev_root;
  ServeOptions serve;
  serve.socket_dir = socket_dir();
  serve.plugins_registry = opts_.registration == RegistrationMode::kPluginsRegistry;
  serve.cdi_dir = opts_.cdi_dir;
  serve.cdi_only = opts_.cdi_only;
  std::vector<Slot> slots;
  for (const auto& rc : cfg.resources) {
    Slot slot;
    slot.plugin = std::make_unique<ResourcePlugin>(rc, make_backend(rc, ctx), serve, &metrics_);
    slots.push_back(std::move(slot));
  }
  return slots;
}

void Daemon::write_cdi(const ResourcePlugin& plugin) {
  if (opts_.cdi_dir.empty()) return;
  std::string error;
  std::string spec = render_cdi_spec(plugin.cdi_kind(), plugin.devices(), plugin.backend());
  if (!write_file_atomically(opts_.cdi_dir, cdi_file_name(plugin.config()), spec, &error))
    spdlog::error("{}: CDI spec not written: {}", plugin.config().full_name(), error);
}

void Daemon::mark_for_registration(Slot* slot) {
  if (opts_.registration != RegistrationMode::kKubelet) return;
  slot->need_register = true;
  slot->next_attempt = Clock::now();
  slot->backoff = milliseconds(50);
}

bool Daemon::start_all(std::vector<Slot>* slots, std::string* error) {
  for (auto& slot : *slots) {
    // discover before serving, so the first ListAndWatch already has devices
    slot.plugin->refresh();
    write_cdi(*slot.plugin);
    auto devs = slot.plugin->devices();
    size_t healthy = 0;
    for (const auto& d : devs) healthy += d.healthy;
    spdlog::info("{} ({} mode): {} device(s), {} healthy", slot.plugin->config().full_name(),
                 mode_name(slot.plugin->config().mode), devs.size(), healthy);
    if (!slot.plugin->start(error)) return false;
    mark_for_registration(&slot);
  }
  return true;
}

void Daemon::stop_all() {
  for (auto& slot : slots_) slot.plugin->stop();
  slots_.clear();
}

void Daemon::reload() {
  spdlog::info("SIGHUP: reloading {}", opts_.config_path);
  PluginConfig fresh;
  try {
    fresh = load_config_file(opts_.config_path);
  } catch (const ConfigError& e) {
    metrics_.count_reload(false);
    spdlog::error("reload rejected, keeping the running configuration: {}", e.what());
    return;
  }
  // Counters survive a reload; only resources that left the config are dropped.
  for (const auto& old : config_.resources) {
    bool kept = false;
    for (const auto& rc : fresh.resources) kept = kept || rc.full_name() == old.full_name();
    if (!kept) metrics_.forget(old.full_name());
  }
  stop_all();
  config_ = fresh;
  slots_ = build(config_);
  std::string error;
  if (!start_all(&slots_, &error)) {
    // Sockets failing now is an environment problem, not a config one; the
    // socket check in the loop keeps retrying.
    spdlog::error("after reload: {}", error);
  }
  metrics_.count_reload(true);
}

void Daemon::handle_events() {
  const std::string sock_dir = socket_dir();
  for (const auto& ev : watcher_->read_events()) {
    switch (ev.kind) {
      case DirEvent::Kind::kOverflow:
        spdlog::warn("inotify queue overflowed; checking sockets");
        ensure_sockets();
        break;
      case DirEvent::Kind::kDirGone:
        spdlog::warn("{} went away; waiting for it to come back", ev.dir);
        dir_lost_ = true;
        break;
      case DirEvent::Kind::kCreated:
        if (ev.dir == opts_.kubelet_dir && ev.name == "kubelet.sock") {
          spdlog::info("kubelet.sock re-created: kubelet restarted, registering again");
          for (auto& slot : slots_) {
            if (!slot.plugin->socket_intact()) {
              std::string error;
              if (!slot.plugin->restart(&error)) spdlog::error("{}", error);
            }
            mark_for_registration(&slot);
          }
        }
        break;
      case DirEvent::Kind::kDeleted:
        if (ev.dir != sock_dir) break;
        for (auto& slot : slots_) {
          if (ev.name != slot.plugin->config().socket_name()) continue;
          // Our own restart also deletes the socket; the inode tells them apart.
          if (slot.plugin->socket_intact()) continue;
          spdlog::info("{}: socket {} deleted (kubelet restart?), serving again",
                       slot.plugin->config().full_name(), ev.name);
          std::string error;
          if (!slot.plugin->restart(&error)) spdlog::error("{}", error);
          mark_for_registration(&slot);
        }
        break;
    }
  }
}

void Daemon::ensure_sockets() {
  std::string error;
  for (const std::string& dir : {opts_.kubelet_dir, socket_dir()}) {
    if (!watcher_->watching(dir) && is_dir(dir)) {
      if (watcher_->watch(dir, &error))
        spdlog::info("watching {} again", dir);
      else
        spdlog::error("{}", error);
    }
  }
  if (dir_lost_ && is_dir(socket_dir())) dir_lost_ = false;
  for (auto& slot : slots_) {
    if (slot.plugin->socket_intact()) continue;
    if (!is_dir(socket_dir())) continue;
    spdlog::info("{}: socket missing, serving again", slot.plugin->config().full_name());
    if (!slot.plugin->restart(&error)) {
      spdlog::error("{}", error);
      continue;
    }
    mark_for_registration(&slot);
  }
}

void Daemon::try_registrations() {
  if (opts_.registration != RegistrationMode::kKubelet) return;
  const auto now = Clock::now();
  const bool kubelet_up = exists(opts_.kubelet_dir + "/kubelet.sock");
  for (auto& slot : slots_) {
    if (!slot.need_register || now < slot.next_attempt || !slot.plugin->running()) continue;
    if (!kubelet_up) continue;  // the kubelet.sock create event will retrigger us
    std::string error;
    const auto& name = slot.plugin->config().full_name();
    if (registrar_->register_plugin(slot.plugin->register_request(), &error)) {
      spdlog::info("{}: registered with kubelet", name);
      metrics_.count_registration(name, true);
      slot.need_register = false;
    } else {
      spdlog::warn("{}: registration failed, retrying in {} ms: {}", name, slot.backoff.count(),
                   error);
      metrics_.count_registration(name, false);
      slot.next_attempt = Clock::now() + slot.backoff;
      slot.backoff = std::min(slot.backoff * 2, ff::kPluginMaxBackoff);
    }
  }
}

void Daemon::rescan() {
  for (auto& slot : slots_) {
    if (slot.plugin->refresh()) write_cdi(*slot.plugin);
  }
}

int Daemon::run(int signal_fd) {
  // 1. read config + 2. validate
  try {
    config_ = load_config_file(opts_.config_path);
  } catch (const ConfigError& e) {
    spdlog::critical("{}: {}", opts_.config_path, e.what());
    return 2;
  }
  std::string error;
  if (!check_environment(&error)) {
    spdlog::critical("{}", error);
    return 1;
  }
  if (!opts_.metrics_address.empty()) {
    metrics_server_ = std::make_unique<metrics::HttpEndpoint>();
    if (!metrics_server_->Start(
            opts_.metrics_address, [this] { return std::optional(metrics_.render()); }, &error)) {
      spdlog::critical("{}", error);
      return 1;
    }
    spdlog::info("metrics on {} (port {})", opts_.metrics_address, metrics_server_->port());
  }
  // Watch before serving so no kubelet restart can slip between the two.
  for (const std::string& dir : {opts_.kubelet_dir, socket_dir()}) {
    if (!watcher_->watching(dir) && !watcher_->watch(dir, &error)) {
      spdlog::critical("{}", error);
      return 1;
    }
  }
  // 3. discover + 4. serve
  slots_ = build(config_);
  if (!start_all(&slots_, &error)) {
    spdlog::critical("{}", error);
    stop_all();
    return 1;
  }
  // 5. register (inside the loop, so failures are retried, never fatal)
  auto next_scan = Clock::now() + config_.health_interval;
  auto next_check = Clock::now() + ff::kPluginSocketCheckPeriod;
  stop_ = false;
  while (!stop_) {
    try_registrations();
    pollfd fds[3] = {{watcher_->fd(), POLLIN, 0}, {stop_fd_, POLLIN, 0}, {signal_fd, POLLIN, 0}};
    int n = ::poll(fds, signal_fd >= 0 ? 3 : 2, static_cast<int>(ff::kPluginLoopTick.count()));
    if (n < 0 && errno != EINTR) {
      spdlog::critical("poll failed: {}", strerror(errno));
      break;
    }
    if (n > 0 && fds[1].revents) break;
    if (n > 0 && signal_fd >= 0 && fds[2].revents) {
      signalfd_siginfo si;
      while (::read(signal_fd, &si, sizeof(si)) == sizeof(si)) {
        if (si.ssi_signo == SIGHUP) {
          reload();
          next_scan = Clock::now() + config_.health_interval;
        } else {
          spdlog::info("signal {}: stopping", si.ssi_signo);
          stop_ = true;
        }
      }
    }
    if (n > 0 && fds[0].revents) handle_events();
    const auto now = Clock::now();
    if (now >= next_scan) {
      rescan();
      next_scan = now + config_.health_interval;
    }
    if (now >= next_check || dir_lost_) {
      if (now >= next_check) {
        ensure_sockets();
        next_check = now + ff::kPluginSocketCheckPeriod;
      }
    }
  }
  stop_all();
  if (metrics_server_) metrics_server_->Stop();
  spdlog::info("stopped; sockets removed");
  return 0;
}

}  // namespace ff::dp
