#include "metrics.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

namespace ff::dp {

void Metrics::set_devices(const std::string& resource, int healthy, int unhealthy) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& r = resources_[resource];
  r.healthy = healthy;
  r.unhealthy = unhealthy;
}

void Metrics::count_allocation(const std::string& resource, bool ok) {
  std::lock_guard<std::mutex> lock(mu_);
  ok ? ++resources_[resource].alloc_ok : ++resources_[resource].alloc_err;
}

void Metrics::count_registration(const std::string& resource, bool ok) {
  std::lock_guard<std::mutex> lock(mu_);
  ok ? ++resources_[resource].reg_ok : ++resources_[resource].reg_err;
}

void Metrics::forget(const std::string& resource) {
  std::lock_guard<std::mutex> lock(mu_);
  resources_.erase(resource);
}

void Metrics::count_reload(bool ok) {
  std::lock_guard<std::mutex> lock(mu_);
  ok ? ++reload_ok_ : ++reload_err_;
}

std::string Metrics::render() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  out += "# HELP freeflow_dp_devices Devices advertised to kubelet, by health.\n";
  out += "# TYPE freeflow_dp_devices gauge\n";
  for (const auto& [name, r] : resources_) {
    out += fmt::format("freeflow_dp_devices{{resource=\"{}\",health=\"Healthy\"}} {}\n", name,
                       r.healthy);
    out += fmt::format("freeflow_dp_devices{{resource=\"{}\",health=\"Unhealthy\"}} {}\n", name,
                       r.unhealthy);
  }
  out += "# HELP freeflow_dp_allocations_total Allocate calls per container request.\n";
  out += "# TYPE freeflow_dp_allocations_total counter\n";
  for (const auto& [name, r] : resources_) {
    out += fmt::format("freeflow_dp_allocations_total{{resource=\"{}\",result=\"ok\"}} {}\n", name,
                       r.alloc_ok);
    out += fmt::format("freeflow_dp_allocations_total{{resource=\"{}\",result=\"error\"}} {}\n",
                       name, r.alloc_err);
  }
  out += "# HELP freeflow_dp_registrations_total Registrations with kubelet.\n";
  out += "# TYPE freeflow_dp_registrations_total counter\n";
  for (const auto& [name, r] : resources_) {
    out += fmt::format("freeflow_dp_registrations_total{{resource=\"{}\",result=\"ok\"}} {}\n",
                       name, r.reg_ok);
    out += fmt::format("freeflow_dp_registrations_total{{resource=\"{}\",result=\"error\"}} {}\n",
                       name, r.reg_err);
  }
  out += "# HELP freeflow_dp_config_reloads_total SIGHUP reloads.\n";
  out += "# TYPE freeflow_dp_config_reloads_total counter\n";
  out += fmt::format("freeflow_dp_config_reloads_total{{result=\"ok\"}} {}\n", reload_ok_);
  out += fmt::format("freeflow_dp_config_reloads_total{{result=\"error\"}} {}\n", reload_err_);
  return out;
}

bool MetricsServer::start(const std::string& address, std::string* error) {
  auto colon = address.rfind(':');
  if (colon == std::string::npos) {
    *error = fmt::format("metrics address '{}' is not host:port", address);
    return false;
  }
  std::string host = address.substr(0, colon);
  int port = 0;
  try {
    port = std::stoi(address.substr(colon + 1));
  } catch (const std::exception&) {
    port = -1;
  }
  if (port < 0 || port > 65535) {
    *error = fmt::format("metrics address '{}' has a bad port", address);
    return false;
  }
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  if (host.empty() || host == "0.0.0.0")
    sa.sin_addr.s_addr = htonl(INADDR_ANY);
  else if (host == "localhost")
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  else if (inet_pton(AF_INET, host.c_str(), &sa.sin_addr) != 1) {
    *error = fmt::format("metrics host '{}' is not an IPv4 address", host);
    return false;
  }
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (listen_fd_ < 0 || ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 ||
      ::listen(listen_fd_, 16) != 0) {
    *error = fmt::format("cannot listen on {}: {}", address, strerror(errno));
    if (listen_fd_ >= 0) ::close(listen_fd_);
    listen_fd_ = -1;
    return false;
  }
  socklen_t len = sizeof(sa);
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&sa), &len);
  port_ = ntohs(sa.sin_port);
  stop_fd_ = ::eventfd(0, EFD_CLOEXEC);
  thread_ = std::thread([this] { serve(); });
  return true;
}

void MetricsServer::stop() {
  if (thread_.joinable()) {
    uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(stop_fd_, &one, sizeof(one));
    thread_.join();
  }
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (stop_fd_ >= 0) ::close(stop_fd_);
  listen_fd_ = stop_fd_ = -1;
}

void MetricsServer::serve() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents) return;
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    // One short request per connection; a slow client gets 1 s, then dropped.
    timeval tv{1, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    char buf[2048];
    ssize_t n = ::recv(fd, buf, sizeof(buf) - 1, 0);
    std::string req = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
    std::string body, status;
    if (req.starts_with("GET /metrics ") || req.starts_with("GET /metrics?")) {
      status = "200 OK";
      body = metrics_.render();
    } else {
      status = "404 Not Found";
      body = "only /metrics here\n";
    }
    std::string resp = fmt::format(
        "HTTP/1.0 {}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n"
        "Connection: close\r\n\r\n{}",
        status, body.size(), body);
    size_t off = 0;
    while (off < resp.size()) {
      ssize_t w = ::send(fd, resp.data() + off, resp.size() - off, MSG_NOSIGNAL);
      if (w <= 0) break;
      off += static_cast<size_t>(w);
    }
    ::close(fd);
  }
}

}  // namespace ff::dp
