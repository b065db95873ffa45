// What a Prometheus scraper does with the /metrics endpoints of the router and the device
// plugin: one HTTP/1.0 request to a server on this machine (bounded: 2 s to connect and for
// each read), and promtool's check of what it got.
#pragma once

#include <cstdint>
#include <string>

namespace ff::test {

struct HttpAnswer {
  int status = 0;  // 0: no answer (refused, closed or timed out)
  std::string body;
};

// `method path` to 127.0.0.1:port, from the address `source` (host order; 0: the kernel's
// choice). Loopback holds every 127/8 address, so a test can stand for other clients.
HttpAnswer HttpRequest(uint16_t port, const std::string& method, const std::string& path,
                       uint32_t source = 0);

// Connects from `source` and sends nothing: a client that holds a connection open. The
// descriptor, or -1.
int HttpIdleConnection(uint16_t port, uint32_t source);

// The value of the one sample `series` (its name and labels as written) in the exposition
// `text`, or -1 when it has none.
double SampleValue(const std::string& text, const std::string& series);

// `promtool check metrics` of `text`: its exit code, and what it printed in *report.
// Fails (-1) when promtool cannot run (scripts/install-deps.sh installs it: prometheus).
int PromtoolCheck(const std::string& text, std::string* report);

}  // namespace ff::test
