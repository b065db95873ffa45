// The router's Prometheus /metrics (docs/metrics.md): an HTTP endpoint on a thread of its
// own (ff::metrics::HttpEndpoint) whose every scrape is rendered on the loop's thread, where
// the router's state lives, so that nothing the loop owns is read from another thread. A
// loop that does not answer within kRenderWaitMs gets the scrape a 503.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "base/event_loop.h"
#include "freeflow/metrics/http_endpoint.h"

namespace ff::router {

class MetricsService {
 public:
  static constexpr int kRenderWaitMs = 2000;

  // Serves at http://address/metrics the process's own families (build, CPU, descriptors,
  // resident memory; read on the endpoint's thread) and what `render` writes on `loop`'s
  // thread. false + *error.
  bool Start(const std::string& address, EventLoop& loop, std::function<std::string()> render,
             std::string* error);
  // Stops serving; waits for a scrape in progress (at most kRenderWaitMs).
  void Stop() { endpoint_.Stop(); }
  uint16_t port() const { return endpoint_.port(); }

 private:
  metrics::HttpEndpoint endpoint_;
};

// Descriptors this process has open (its /proc/self/fd entries, less the one reading them).
size_t OpenDescriptors();
// Resident set size in KiB (/proc/self/statm).
uint64_t ResidentKib();

}  // namespace ff::router
