#include "freeflow/metrics/http_endpoint.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <spdlog/spdlog.h>
#include <time.h>

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <string_view>

namespace ff::metrics {
namespace {

constexpr const char* kContentType = "text/plain; version=0.0.4; charset=utf-8";

MHD_Result Answer(MHD_Connection* connection, unsigned status, std::string_view body,
                  const char* content_type) {
  MHD_Response* response = MHD_create_response_from_buffer(
      body.size(), const_cast<char*>(body.data()), MHD_RESPMEM_MUST_COPY);
  if (response == nullptr) return MHD_NO;
  MHD_add_response_header(response, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
  const MHD_Result r = MHD_queue_response(connection, status, response);
  MHD_destroy_response(response);
  return r;
}

// libmicrohttpd's request callback: the first call of a request has no upload yet, which a
// GET never has; anything with a body is refused before it is read.
MHD_Result OnRequest(void* cls, MHD_Connection* connection, const char* url, const char* method,
                     const char*, const char*, size_t* upload_size, void**) {
  const auto* render = static_cast<const HttpEndpoint::Render*>(cls);
  const std::string_view m(method);
  if (m != MHD_HTTP_METHOD_GET && m != MHD_HTTP_METHOD_HEAD) {
    *upload_size = 0;
    return Answer(connection, MHD_HTTP_METHOD_NOT_ALLOWED, "only GET here\n", "text/plain");
  }
  if (std::string_view(url) != "/metrics")
    return Answer(connection, MHD_HTTP_NOT_FOUND, "only /metrics here\n", "text/plain");
  std::optional<std::string> body;
  try {
    body = (*render)();
  } catch (const std::exception& e) {
    spdlog::error("metrics: rendering failed: {}", e.what());
  }
  if (!body)
    return Answer(connection, MHD_HTTP_SERVICE_UNAVAILABLE, "not available now, ask again\n",
                  "text/plain");
  return Answer(connection, MHD_HTTP_OK, *body, kContentType);
}

// libmicrohttpd's messages (a connection refused at a limit, one that timed out): a client
// that provokes them at will gets one line a second logged, and a count of the others.
void OnLog(void*, const char* format, va_list args) {
  static std::atomic<uint64_t> next_ns{0};
  static std::atomic<uint64_t> held_back{0};
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  const uint64_t ns =
      static_cast<uint64_t>(now.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(now.tv_nsec);
  uint64_t due = next_ns.load();
  if (ns < due || !next_ns.compare_exchange_strong(due, ns + 1'000'000'000ull)) {
    ++held_back;
    return;
  }
  char line[512];
  std::vsnprintf(line, sizeof(line), format, args);
  size_t n = std::strlen(line);
  while (n > 0 && line[n - 1] == '\n') line[--n] = '\0';
  spdlog::warn("metrics endpoint: {} ({} more messages since the last line)", line,
               held_back.exchange(0));
}

}  // namespace

bool ParseListenAddress(const std::string& address, uint32_t* ip, uint16_t* port,
                        std::string* error) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) {
    *error = fmt::format("metrics address '{}' is not host:port", address);
    return false;
  }
  const std::string host = address.substr(0, colon);
  const std::string digits = address.substr(colon + 1);
  unsigned long value = 0;
  bool ok = !digits.empty() && digits.size() <= 5;
  for (char c : digits) {
    if (c < '0' || c > '9') ok = false;
    value = value * 10 + static_cast<unsigned long>(c - '0');
  }
  if (!ok || value > 65535) {
    *error = fmt::format("metrics address '{}' has a bad port", address);
    return false;
  }
  *port = static_cast<uint16_t>(value);
  if (host.empty() || host == "0.0.0.0") {
    *ip = INADDR_ANY;
  } else if (host == "localhost") {
    *ip = INADDR_LOOPBACK;
  } else {
    in_addr a{};
    if (inet_pton(AF_INET, host.c_str(), &a) != 1) {
      *error = fmt::format("metrics host '{}' is not an IPv4 address", host);
      return false;
    }
    *ip = ntohl(a.s_addr);
  }
  return true;
}

bool HttpEndpoint::Start(const std::string& address, Render render, std::string* error) {
  Stop();
  uint32_t ip = 0;
  uint16_t port = 0;
  if (!ParseListenAddress(address, &ip, &port, error)) return false;
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  sa.sin_addr.s_addr = htonl(ip);
  render_ = std::move(render);
  // The logger first, so that no message goes to libmicrohttpd's own (stderr); the address
  // not shared (no SO_REUSEPORT), so that a second daemon on it fails to start.
  daemon_ = MHD_start_daemon(
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_ERROR_LOG, port, nullptr, nullptr,
      &OnRequest, &render_, MHD_OPTION_EXTERNAL_LOGGER, &OnLog, nullptr, MHD_OPTION_SOCK_ADDR, &sa,
      MHD_OPTION_CONNECTION_LIMIT, kConnectionLimit, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
      kPerClientLimit, MHD_OPTION_CONNECTION_TIMEOUT, kTimeoutSeconds, MHD_OPTION_END);
  if (daemon_ == nullptr) {
    *error =
        fmt::format("cannot serve metrics on {} (in use, or not this host's address)", address);
    return false;
  }
  const MHD_DaemonInfo* info = MHD_get_daemon_info(daemon_, MHD_DAEMON_INFO_BIND_PORT);
  port_ = info != nullptr ? info->port : port;
  return true;
}

void HttpEndpoint::Stop() {
  if (daemon_ == nullptr) return;
  MHD_stop_daemon(daemon_);
  daemon_ = nullptr;
  port_ = 0;
}

}  // namespace ff::metrics
