#include "base/event_log.h"

#include <time.h>

namespace ff::router {

void EventLog::Note(uint32_t ip, std::string what, std::string reason) {
  timespec now{};
  ::clock_gettime(CLOCK_REALTIME, &now);
  if (entries_.size() == kEntries) entries_.pop_front();
  entries_.push_back(
      {static_cast<uint64_t>(now.tv_sec) * 1000 + static_cast<uint64_t>(now.tv_nsec) / 1'000'000,
       ip, std::move(what), std::move(reason)});
  ++noted_;
}

}  // namespace ff::router
