// The /metrics endpoint: an HTTP server (GNU libmicrohttpd, on a thread of its own) that
// answers GET /metrics with what a rendering function returns, 404 for any other path and
// 405 for any other method. Few connections at a time (kConnectionLimit, kPerClientLimit) and
// a timeout, so a client that floods it or stalls costs the daemon nothing but this thread.
//
// Threading: Start and Stop on one thread; the rendering function runs on the endpoint's
// thread, one request at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

struct MHD_Daemon;

namespace ff::metrics {

class HttpEndpoint {
 public:
  // The body of a 200 answer, or nullopt for 503 (the daemon cannot answer now).
  using Render = std::function<std::optional<std::string>()>;
  static constexpr unsigned kConnectionLimit = 16;
  static constexpr unsigned kPerClientLimit = 4;
  static constexpr unsigned kTimeoutSeconds = 5;

  HttpEndpoint() = default;
  HttpEndpoint(const HttpEndpoint&) = delete;
  HttpEndpoint& operator=(const HttpEndpoint&) = delete;
  ~HttpEndpoint() { Stop(); }

  // Listens on `address`, "host:port" (an IPv4 address, "localhost", or an empty host or
  // 0.0.0.0 for every address; port 0 picks a free one). false + *error otherwise.
  bool Start(const std::string& address, Render render, std::string* error);
  void Stop();
  uint16_t port() const { return port_; }
  bool running() const { return daemon_ != nullptr; }

 private:
  MHD_Daemon* daemon_ = nullptr;
  Render render_;
  uint16_t port_ = 0;
};

// Parses "host:port" as Start does: the IPv4 address and port in host byte order, or false
// + *error.
bool ParseListenAddress(const std::string& address, uint32_t* ip, uint16_t* port,
                        std::string* error);

}  // namespace ff::metrics
