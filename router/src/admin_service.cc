#include "admin_service.h"

#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "freeflow/clock.h"

namespace ff::router {

AdminService::~AdminService() {
  for (auto& [id, c] : clients_) loop_.Unwatch(c.watch);
  if (listen_watch_ != 0) loop_.Unwatch(listen_watch_);
}

bool AdminService::Start(const std::string& name, std::string* error) {
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  if (name.size() + 1 > sizeof(sa.sun_path)) {
    *error = "admin socket name '" + name + "' is too long for a Unix socket";
    return false;
  }
  std::memcpy(sa.sun_path + 1, name.data(), name.size());  // sun_path[0] = 0: abstract
  const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd || ::bind(fd.get(), reinterpret_cast<sockaddr*>(&sa), len) != 0 ||
      ::listen(fd.get(), 16) != 0) {
    *error = "cannot listen on admin socket @" + name + ": " + std::strerror(errno);
    return false;
  }
  listen_ = std::move(fd);
  listen_watch_ = loop_.Watch(listen_.get(), EPOLLIN, [this](uint32_t) { Accept(); });
  return listen_watch_ != 0;
}

void AdminService::Accept() {
  for (int i = 0; i < 16; ++i) {
    UniqueFd fd(::accept4(listen_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!fd) return;
    ucred who{};
    socklen_t len = sizeof(who);
    const bool root =
        ::getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &who, &len) == 0 && who.uid == 0;
    if (!root || clients_.size() >= kMaxClients) {
      // A line the client can read: ffctl prints it.
      const char* why = !root ? "{\"error\":\"the admin socket answers root only\"}\n"
                              : "{\"error\":\"too many admin clients at once; try again\"}\n";
      [[maybe_unused]] ssize_t n = ::send(fd.get(), why, std::strlen(why), MSG_NOSIGNAL);
      ++refused_;
      continue;
    }
    const uint64_t id = next_id_++;
    Client& c = clients_[id];
    c.fd = std::move(fd);
    c.deadline_ns = MonotonicNs() + kTimeoutNs;
    c.watch = loop_.Watch(c.fd.get(), EPOLLIN | EPOLLRDHUP,
                          [this, id](uint32_t events) { OnEvents(id, events); });
  }
}

void AdminService::OnEvents(uint64_t id, uint32_t events) {
  auto it = clients_.find(id);
  if (it == clients_.end()) return;
  Client& c = it->second;
  if (!c.out.empty()) {  // answering: only writability matters
    if ((events & (EPOLLERR | EPOLLHUP)) != 0 || Flush(c)) End(id);
    return;
  }
  char buf[512];
  for (;;) {
    const ssize_t n = ::recv(c.fd.get(), buf, sizeof(buf), 0);
    if (n > 0) {
      c.in.append(buf, static_cast<size_t>(n));
      if (c.in.size() > kMaxRequest) return End(id);
      const size_t eol = c.in.find('\n');
      if (eol == std::string::npos) continue;
      c.out = answer_(c.in.substr(0, eol));
      c.out += '\n';
      loop_.Modify(c.watch, EPOLLOUT);
      if (Flush(c)) End(id);
      return;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (errno == EINTR) continue;
      if ((events & (EPOLLERR | EPOLLHUP | EPOLLRDHUP)) != 0) End(id);
      return;
    }
    return End(id);  // closed before a whole line
  }
}

bool AdminService::Flush(Client& c) {
  while (c.sent < c.out.size()) {
    const ssize_t n = ::send(c.fd.get(), c.out.data() + c.sent, c.out.size() - c.sent,
                             MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      c.sent += static_cast<size_t>(n);
      continue;
    }
    return !(n < 0 && (errno == EAGAIN || errno == EINTR));  // an error ends it
  }
  return true;
}

void AdminService::End(uint64_t id) {
  auto it = clients_.find(id);
  if (it == clients_.end()) return;
  loop_.Unwatch(it->second.watch);
  clients_.erase(it);
}

void AdminService::Tick(uint64_t now_ns) {
  for (auto it = clients_.begin(); it != clients_.end();) {
    const uint64_t id = it->first;
    const bool late = now_ns > it->second.deadline_ns;
    ++it;
    if (late) End(id);
  }
}

}  // namespace ff::router
