// The device plugin's Prometheus counters and gauges (docs/metrics.md), rendered in the text
// format by the writer it shares with the router (freeflow/metrics) and served by the
// daemon's ff::metrics::HttpEndpoint. All Metrics methods are thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

namespace ff::dp {

class Metrics {
 public:
  void set_devices(const std::string& resource, int healthy, int unhealthy);
  void count_allocation(const std::string& resource, bool ok);
  void count_registration(const std::string& resource, bool ok);
  void forget(const std::string& resource);  // resource removed by a reload
  void count_reload(bool ok);
  std::string render() const;

 private:
  struct PerResource {
    int healthy = 0;
    int unhealthy = 0;
    uint64_t alloc_ok = 0, alloc_err = 0, reg_ok = 0, reg_err = 0;
  };
  mutable std::mutex mu_;
  std::map<std::string, PerResource> resources_;
  uint64_t reload_ok_ = 0, reload_err_ = 0;
};

}  // namespace ff::dp
