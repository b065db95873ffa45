// Helpers shared by the router fuzz targets.
//
// Waiting for the router's thread without sleeping a millisecond per look (WaitFor in the
// router harness sleeps that long, which would cap a fuzz target near 1,000 runs a second).
#pragma once

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>

namespace fuzz {

// Polls `done` until it holds (true) or `limit` passes (false): yields first, then naps.
template <typename Pred>
bool Settle(Pred done, std::chrono::milliseconds limit = std::chrono::milliseconds(5000)) {
  const auto end = std::chrono::steady_clock::now() + limit;
  for (int tries = 0; !done(); ++tries) {
    if (std::chrono::steady_clock::now() > end) return false;
    if (tries < 200) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
  return true;
}

// The router targets keep one router for the whole run and never destroy it (libFuzzer ends
// the process with exit()); this removes its folder under /tmp when the process exits.
inline void RemoveAtExit(const std::string& dir) {
  static std::string* kept = new std::string(dir);
  std::atexit([] {
    std::error_code ec;
    std::filesystem::remove_all(*kept, ec);
  });
}

// The one rig of the run, made on first use; R holds the router as `router`.
template <typename R>
R& RigOfTheRun() {
  static R* rig = [] {
    auto* made = new R();
    RemoveAtExit(made->router->dir());
    return made;
  }();
  return *rig;
}

}  // namespace fuzz
