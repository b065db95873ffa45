#include "admin_client.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>

#include "freeflow/fd.h"
#include "freeflow/router_socket.h"

namespace ff::ctl {
namespace {

bool WaitFor(int fd, short what) {
  pollfd p{fd, what, 0};
  int n;
  do {
    n = ::poll(&p, 1, kTimeoutMs);
  } while (n < 0 && errno == EINTR);
  return n > 0;
}

}  // namespace

std::string Ask(const std::string& dir, const std::string& name, const std::string& request,
                std::string* error) {
  const std::string where = AdminSocketName(dir, name);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  if (where.size() + 1 > sizeof(sa.sun_path)) {
    *error = "the admin socket name of " + dir + "/" + name + " is too long";
    return "";
  }
  std::memcpy(sa.sun_path + 1, where.data(), where.size());
  const auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + where.size());
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd || ::connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), len) != 0) {
    *error = "no router answers at @" + where + " (" + std::strerror(errno) +
             "): is ffrouter running with --dir " + dir + " --name " + name +
             ", and is this the node's network namespace?";
    return "";
  }
  ucred peer{};
  socklen_t plen = sizeof(peer);
  if (::getsockopt(fd.get(), SOL_SOCKET, SO_PEERCRED, &peer, &plen) != 0 || peer.uid != 0) {
    *error = "@" + where + " is held by a process of uid " + std::to_string(peer.uid) + " (pid " +
             std::to_string(peer.pid) + "), not the router: not asking it";
    return "";
  }
  // A send the router cut short (it refused the connection) still leaves its reason to read.
  const std::string line = request + "\n";
  std::string send_error;
  if (!WaitFor(fd.get(), POLLOUT) ||
      ::send(fd.get(), line.data(), line.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(line.size()))
    send_error = "cannot send to the router: " + std::string(std::strerror(errno));
  std::string answer;
  char buf[65536];
  for (;;) {
    if (!WaitFor(fd.get(), POLLIN)) {
      *error = "the router did not answer within " + std::to_string(kTimeoutMs / 1000) + " s";
      return "";
    }
    const ssize_t n = ::recv(fd.get(), buf, sizeof(buf), 0);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == ECONNRESET && !send_error.empty()) break;
      *error = "reading the router's answer: " + std::string(std::strerror(errno));
      return "";
    }
    answer.append(buf, static_cast<size_t>(n));
    if (answer.size() > kMaxAnswer) {
      *error = "the router's answer is larger than " + std::to_string(kMaxAnswer >> 20) + " MiB";
      return "";
    }
  }
  if (answer.empty())
    *error =
        !send_error.empty() ? send_error : "the router closed the connection without an answer";
  return answer;
}

}  // namespace ff::ctl
