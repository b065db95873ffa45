// The router's last refusals, with their reasons, for an admin (`ffctl events`): what the
// log says once per kQuotaLogIntervalNs, kept whole in a bounded ring (kEventLogEntries,
// the oldest dropped first) with a count of everything ever noted.
// Threading: the loop's thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>

namespace ff::router {

class EventLog {
 public:
  static constexpr size_t kEntries = 256;
  struct Entry {
    uint64_t unix_ms = 0;  // wall clock, for a person to read
    uint32_t ip = 0;       // the pod's overlay address (host order); 0: none known
    std::string what;      // "quota qps", "session refused", ...
    std::string reason;    // the sentence the pod got, or the log line
  };

  void Note(uint32_t ip, std::string what, std::string reason);
  const std::deque<Entry>& entries() const { return entries_; }
  uint64_t noted() const { return noted_; }

 private:
  std::deque<Entry> entries_;
  uint64_t noted_ = 0;
};

}  // namespace ff::router
