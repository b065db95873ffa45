// static:FILE. The file is watched with inotify on its directory (so that atomic renames
// and Kubernetes ConfigMap symlink swaps are seen), with a stat() poll as a safety net.
#include <errno.h>
#include <fmt/format.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "cache.h"
#include "freeflow/tunables.h"
#include "implementations.h"
#include "node_claim.h"
#include "static_file.h"

namespace ff::cp {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// What stat() says about the file behind the path (symlinks followed), to notice changes
// when inotify says nothing (e.g. network file systems).
struct FileStamp {
  dev_t dev = 0;
  ino_t ino = 0;
  off_t size = -1;
  int64_t mtime_ns = 0;
  bool operator==(const FileStamp&) const = default;
};

FileStamp Stamp(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return {};
  return {st.st_dev, st.st_ino, st.st_size,
          static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
}

bool ReadFile(const std::string& path, std::string* text, std::string* error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *error = fmt::format("cannot open {}: {}", path, strerror(errno));
    return false;
  }
  std::ostringstream buf;
  buf << in.rdbuf();
  if (in.bad()) {
    *error = fmt::format("cannot read {}", path);
    return false;
  }
  *text = buf.str();
  return true;
}

class StaticControlPlane final : public ControlPlane {
 public:
  StaticControlPlane(std::string path, const Endpoint& self, const Options& options)
      : path_(std::move(path)), options_(options), cache_(self) {}

  ~StaticControlPlane() override {
    if (thread_.joinable()) {
      stop_ = true;
      const uint64_t one = 1;
      [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof(one));
      thread_.join();
    }
    if (inotify_fd_ >= 0) ::close(inotify_fd_);
    if (wake_fd_ >= 0) ::close(wake_fd_);
  }

  void Publish(uint32_t ip) override { cache_.AddLocal(ip); }
  void Withdraw(uint32_t ip) override { cache_.RemoveLocal(ip); }
  std::optional<Endpoint> Lookup(uint32_t ip) const override { return cache_.Lookup(ip); }
  std::vector<Endpoint> Nodes() const override { return cache_.Nodes(); }
  void OnChange(std::function<void()> cb) override { on_change_ = std::move(cb); }
  bool Healthy() const override { return loaded_; }

  bool Start(std::string* error) override {
    if (thread_.joinable()) {
      *error = "the control plane is already started";
      return false;
    }
    // Absolute, so that a later chdir() of the process does not lose the file.
    std::error_code ec;
    if (auto abs = std::filesystem::absolute(path_, ec); !ec) path_ = abs.lexically_normal();
    std::string text, why;
    Mapping mapping;
    if (!ReadFile(path_, &text, &why) || !ParseStaticFile(text, &mapping, &why)) {
      *error = fmt::format("control plane file {}: {}", path_, why);
      return false;
    }
    const SelfCheck check = CheckSelf(mapping, cache_.self());
    if (check.fatal) {
      *error = fmt::format("control plane file {}: {}", path_, check.problem);
      return false;
    }
    if (!check.problem.empty()) spdlog::warn("control plane file {}: {}", path_, check.problem);
    self_problem_ = check.problem;

    dir_ = std::filesystem::path(path_).parent_path().string();
    if (dir_.empty()) dir_ = ".";
    wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    inotify_fd_ = ::inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
    if (wake_fd_ < 0 || inotify_fd_ < 0) {
      *error = fmt::format("cannot watch {} for changes: {}", path_, strerror(errno));
      return false;
    }
    stamp_ = Stamp(path_);
    last_text_ = std::move(text);
    cache_.Replace(std::move(mapping));
    loaded_ = true;
    AddWatch();
    spdlog::info("control plane: loaded {} ({} nodes)", path_, cache_.Snapshot().nodes.size());
    thread_ = std::thread([this] { Run(); });
    return true;
  }

 private:
  void AddWatch() {
    watch_ =
        ::inotify_add_watch(inotify_fd_, dir_.c_str(),
                            IN_CREATE | IN_CLOSE_WRITE | IN_MODIFY | IN_MOVED_TO | IN_MOVED_FROM |
                                IN_DELETE | IN_ATTRIB | IN_DELETE_SELF | IN_MOVE_SELF);
    if (watch_ < 0)
      spdlog::warn("control plane: cannot watch {} ({}); polling {} every {} ms", dir_,
                   strerror(errno), path_, kStaticFilePollInterval.count());
  }

  // Drains pending inotify events; true if any concerned the directory.
  bool DrainInotify() {
    alignas(inotify_event) char buf[4096];
    bool any = false;
    for (int round = 0; round < 64; ++round) {  // bounded; the rest waits for the next poll
      const ssize_t n = ::read(inotify_fd_, buf, sizeof(buf));
      if (n <= 0) break;
      any = true;
      for (ssize_t off = 0; off < n;) {
        const auto* ev = reinterpret_cast<const inotify_event*>(buf + off);
        off += static_cast<ssize_t>(sizeof(inotify_event) + ev->len);
        if (ev->mask & IN_IGNORED) watch_ = -1;  // the directory went away; re-added later
      }
    }
    return any;
  }

  // Waits up to `timeout` for an inotify event or a stop request. true if inotify fired.
  bool Wait(milliseconds timeout) {
    pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {inotify_fd_, POLLIN, 0}};
    const int n = ::poll(fds, 2, static_cast<int>(timeout.count()));
    return n > 0 && (fds[1].revents & POLLIN);
  }

  void Run() {
    auto next_poll = Clock::now() + kStaticFilePollInterval;
    while (!stop_) {
      const auto now = Clock::now();
      const auto timeout =
          std::max(milliseconds(0), std::chrono::duration_cast<milliseconds>(next_poll - now));
      bool changed = Wait(timeout) && DrainInotify();
      if (stop_) break;
      if (Clock::now() >= next_poll) {
        next_poll = Clock::now() + kStaticFilePollInterval;
        if (watch_ < 0) AddWatch();
        changed = changed || Stamp(path_) != stamp_;
      }
      if (!changed) continue;
      // Debounce: wait until the directory has been quiet for reload_debounce (at most
      // 20 rounds, so a file rewritten nonstop is still picked up).
      for (int round = 0; round < 20 && !stop_; ++round)
        if (!(Wait(options_.reload_debounce) && DrainInotify())) break;
      if (!stop_) Reload();
    }
  }

  void Reload() {
    stamp_ = Stamp(path_);
    std::string text, why;
    if (!ReadFile(path_, &text, &why)) {
      spdlog::error("control plane: {}; keeping the previous mapping", why);
      return;
    }
    if (text == last_text_) return;
    Mapping mapping;
    if (!ParseStaticFile(text, &mapping, &why)) {
      spdlog::error("control plane file {}: {}; keeping the previous mapping", path_, why);
      last_text_ = std::move(text);  // do not report the same bad file again
      return;
    }
    last_text_ = std::move(text);
    ReportSelf(CheckSelf(mapping, cache_.self()));
    const size_t nodes = mapping.nodes.size();
    if (cache_.Replace(std::move(mapping))) {
      spdlog::info("control plane: reloaded {} ({} nodes)", path_, nodes);
      if (on_change_) on_change_();
    }
  }

  // A reloaded file that now names this router wrongly cannot stop it any more: say so
  // (once per change), and keep serving with its own endpoint.
  void ReportSelf(const SelfCheck& check) {
    if (check.problem == self_problem_) return;
    self_problem_ = check.problem;
    if (check.fatal)
      spdlog::error("control plane file {}: {}; this router keeps its own address", path_,
                    check.problem);
    else if (!check.problem.empty())
      spdlog::warn("control plane file {}: {}", path_, check.problem);
    else
      spdlog::info("control plane file {} now lists node {} at {}, as this router serves", path_,
                   cache_.self().node, FormatEndpoint(cache_.self()));
  }

  std::string path_;
  const Options options_;
  Cache cache_;
  std::function<void()> on_change_;
  std::atomic<bool> loaded_{false};
  std::atomic<bool> stop_{false};
  std::string dir_;
  int wake_fd_ = -1;
  int inotify_fd_ = -1;
  int watch_ = -1;
  FileStamp stamp_;
  std::string last_text_;
  std::string self_problem_;  // what the file in force says wrongly about this router
  std::thread thread_;
};

}  // namespace

std::unique_ptr<ControlPlane> MakeStaticControlPlane(std::string path, const Endpoint& self,
                                                     const Options& options) {
  return std::make_unique<StaticControlPlane>(std::move(path), self, options);
}

}  // namespace ff::cp
