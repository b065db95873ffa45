// Prometheus text-format counters and gauges, served on a tiny HTTP listener.
// All Metrics methods are thread-safe. MetricsServer runs one thread that
// answers GET /metrics (anything else gets 404) and stops in stop().
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>

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

class MetricsServer {
 public:
  explicit MetricsServer(const Metrics& metrics) : metrics_(metrics) {}
  ~MetricsServer() { stop(); }
  // address is "host:port" (IPv4 or "localhost"); port 0 picks a free one.
  bool start(const std::string& address, std::string* error);
  void stop();
  int port() const { return port_; }

 private:
  void serve();
  const Metrics& metrics_;
  int listen_fd_ = -1;
  int stop_fd_ = -1;
  int port_ = 0;
  std::thread thread_;
};

}  // namespace ff::dp
