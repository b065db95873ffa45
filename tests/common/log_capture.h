// Captures what the process logs through spdlog's default logger, for tests that check a
// daemon said something (or did not say it twice).
#pragma once

#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>

#include <initializer_list>
#include <memory>
#include <string>

namespace ff::testing {

// While it lives, the default logger keeps the last 256 lines at `level` and above.
class LogCapture {
 public:
  explicit LogCapture(spdlog::level::level_enum level = spdlog::level::warn)
      : sink_(std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(256)),
        previous_(spdlog::default_logger()) {
    auto logger = std::make_shared<spdlog::logger>("capture", sink_);
    logger->set_level(level);
    spdlog::set_default_logger(logger);
  }
  ~LogCapture() { spdlog::set_default_logger(previous_); }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;

  // How many captured lines contain every one of `parts`.
  int Count(std::initializer_list<const char*> parts) const {
    int n = 0;
    for (const std::string& line : sink_->last_formatted()) {
      bool all = true;
      for (const char* part : parts) all = all && line.find(part) != std::string::npos;
      n += all ? 1 : 0;
    }
    return n;
  }

 private:
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink_;
  std::shared_ptr<spdlog::logger> previous_;
};

}  // namespace ff::testing
