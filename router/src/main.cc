// ffrouter: the per-node freeflow router daemon. parse -> validate -> start -> serve until
// SIGTERM/SIGINT. SIGUSR1 logs one line of what the router holds (Router::StatsLine).
#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "options.h"
#include "router.h"

namespace {

ff::router::Router* g_router = nullptr;
volatile sig_atomic_t g_stop_asked = 0;  // SIGTERM/SIGINT came
volatile sig_atomic_t g_handed_over = 0;

// Whichever thread a stop signal reaches: a router that handed over ends there (its pods
// are the successor's; nothing of its own is left to release).
void OnSignal(int) {
  if (g_handed_over != 0) ::_exit(0);
  g_stop_asked = 1;
  if (g_router != nullptr) g_router->Stop();  // async-signal-safe
}

void OnStatsSignal(int) {
  if (g_router != nullptr) g_router->RequestStats();  // async-signal-safe
}

// The ready file (--ready-file): written once the router serves, removed when it stops
// serving (a stop, or a hand-over). false + *error when it cannot be written.
bool MarkReady(const std::string& path, std::string* error) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (fd < 0 || ::write(fd, pid.data(), pid.size()) != static_cast<ssize_t>(pid.size())) {
    *error = "cannot write the ready file " + path + ": " + std::strerror(errno);
    if (fd >= 0) ::close(fd);
    return false;
  }
  ::close(fd);
  return true;
}

void Unready(const std::string& path) {
  if (!path.empty()) ::unlink(path.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ ffrouter: %v");
  // 1. Parse and validate the flags and environment.
  int exit_code = 0;
  auto config = ff::router::ParseOptions(argc, argv, &exit_code);
  if (!config) return exit_code;
  ff::router::ApplyProcessOptions(*config);
  // 2. The node's collaborators: identity by network namespace, control plane, TCP links.
  std::string error;
  ff::router::RouterDeps deps;
  if (!ff::router::MakeNodeDeps(*config, &deps, &error)) {
    spdlog::error("{}", error);
    return 1;
  }
  // 3. Start: host folder, control plane, router port, pod socket.
  ff::router::Router router(*config, std::move(deps));
  if (!router.Start(&error) ||
      (!config->ready_file.empty() && !MarkReady(config->ready_file, &error))) {
    spdlog::error("{}", error);
    return 1;
  }
  // 4. Serve until a signal stops the loop.
  g_router = &router;
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  struct sigaction stats {};
  stats.sa_handler = OnStatsSignal;
  stats.sa_flags = SA_RESTART;
  sigaction(SIGUSR1, &stats, nullptr);
  signal(SIGPIPE, SIG_IGN);
  router.Run();
  g_router = nullptr;
  Unready(config->ready_file);
  if (router.handed_over()) {
    // What this router held is the successor's now: close every descriptor without releasing
    // anything (no destructor runs: they would give back what pods hold) and wait to be
    // stopped, as a DaemonSet's old pod is next (docs/handover.md). The signal may reach
    // any thread (the others do not block it), and may have come during the hand-over.
    g_handed_over = 1;
    // The connection to the successor last: its end tells the successor that the ports
    // it binds next (metrics, node links) are free.
    const int end = router.successor_socket();
    if (end > 3) ::close_range(3, static_cast<unsigned>(end) - 1, 0);
    ::close_range(end >= 3 ? static_cast<unsigned>(end) + 1 : 3, ~0U, 0);
    if (end >= 0) ::close(end);
    spdlog::info("handed over; waiting for SIGTERM");
    if (g_stop_asked != 0) ::_exit(0);
    for (;;) ::pause();
  }
  return 0;
}
