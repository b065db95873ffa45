#include "scrape.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

namespace ff::test {

int HttpIdleConnection(uint16_t port, uint32_t source) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  timeval tv{2, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  if (source != 0) {
    sa.sin_addr.s_addr = htonl(source);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
      ::close(fd);
      return -1;
    }
  }
  sa.sin_port = htons(port);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

HttpAnswer HttpRequest(uint16_t port, const std::string& method, const std::string& path,
                       uint32_t source) {
  HttpAnswer answer;
  const int fd = HttpIdleConnection(port, source);
  if (fd < 0) return answer;
  // Longer than a router's render wait (2 s, MetricsService::kRenderWaitMs): its 503 comes
  // just after it, later still on a loaded machine.
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  const std::string request = method + " " + path + " HTTP/1.0\r\n\r\n";
  if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(request.size())) {
    ::close(fd);
    return answer;
  }
  std::string text;
  char buf[4096];
  for (int i = 0; i < 4096; ++i) {  // at most 16 MiB
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  // "HTTP/1.x NNN reason\r\n...\r\n\r\nbody"
  const size_t head_end = text.find("\r\n\r\n");
  if (!text.starts_with("HTTP/1.") || text.size() < 12 || head_end == std::string::npos)
    return answer;
  answer.status = std::atoi(text.substr(9, 3).c_str());
  answer.body = text.substr(head_end + 4);
  return answer;
}

double SampleValue(const std::string& text, const std::string& series) {
  const std::string line = "\n" + series + " ";
  const size_t at = text.find(line);
  if (at == std::string::npos) return -1;
  return std::stod(text.substr(at + line.size()));
}

int PromtoolCheck(const std::string& text, std::string* report) {
  char path[] = "/tmp/ff-metrics-XXXXXX";
  const int fd = ::mkstemp(path);
  if (fd < 0) return -1;
  ::close(fd);
  {
    std::ofstream out(path);
    out << text;
  }
  const std::string command = std::string("promtool check metrics < ") + path + " 2>&1";
  std::FILE* p = ::popen(command.c_str(), "r");
  if (p == nullptr) {
    ::unlink(path);
    return -1;
  }
  char buf[512];
  report->clear();
  while (std::fgets(buf, sizeof(buf), p) != nullptr) report->append(buf);
  const int status = ::pclose(p);
  ::unlink(path);
  if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) == 127) return -1;
  return WEXITSTATUS(status);
}

}  // namespace ff::test
