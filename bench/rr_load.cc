// Small request/response over TCP, as the clients of a process-per-connection server or an
// RPC service make it (bench/tcp_mode.sh, tests/integration/tcp_mode; issue 39): CONNS
// connections, each driven by a thread of its own that sends SIZE bytes, then reads SIZE
// bytes back (the server echoes) and checks them, for SECONDS; the threads sleep in recv
// while the server works, as such clients do.
//   rr_load IP PORT CONNS SIZE SECONDS
// Prints one line and exits 0 when every byte came back as sent, each connection made at
// least one exchange and closed cleanly (the server's end of file after ours):
//   rr_load: CONNS connections SIZE B: R requests/s, p50 P us, p99 Q us, N requests,
//   cpu U us a request
// (cpu: this process's user and system time per exchange). 1 and a reason on any error.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr int kConnectTries = 200;    // 10 s for the server to listen
constexpr int kIoTimeoutMs = 10'000;  // no exchange may take longer: a stuck server fails
constexpr int kMaxConns = 1024;
constexpr size_t kMaxSize = 1u << 20;

uint64_t NowNs() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC, &t);
  return static_cast<uint64_t>(t.tv_sec) * 1'000'000'000ull + t.tv_nsec;
}

struct Result {
  std::string error;
  std::vector<uint32_t> lat_ns;  // a sample of exchange times
  uint64_t count = 0;
};

int Connect(const sockaddr_in& a) {
  for (int i = 0; i < kConnectTries; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof(a)) == 0) {
      const int one = 1;
      (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      struct timeval tv {
        kIoTimeoutMs / 1000, 0
      };
      (void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
      (void)setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
      return fd;
    }
    close(fd);
    if (errno != ECONNREFUSED) return -1;
    usleep(50'000);
  }
  errno = ECONNREFUSED;
  return -1;
}

bool SendAll(int fd, const uint8_t* p, size_t n) {
  while (n > 0) {
    const ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// 1: all n bytes; 0: end of file first; -1: an error.
int RecvAll(int fd, uint8_t* p, size_t n) {
  while (n > 0) {
    const ssize_t r = recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -1;
    if (r == 0) return 0;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return 1;
}

void Drive(const sockaddr_in& a, size_t size, uint64_t end_ns, int id, Result* out) {
  const int fd = Connect(a);
  if (fd < 0) {
    out->error = std::string("connect: ") + strerror(errno);
    return;
  }
  std::vector<uint8_t> tx(size), rx(size);
  out->lat_ns.reserve(1 << 16);
  uint64_t seq = 0;
  while (NowNs() < end_ns) {
    for (size_t i = 0; i < size; ++i) tx[i] = static_cast<uint8_t>(seq * 131 + i * 7 + id);
    const uint64_t t0 = NowNs();
    if (!SendAll(fd, tx.data(), size)) {
      out->error = std::string("send: ") + strerror(errno);
      break;
    }
    const int r = RecvAll(fd, rx.data(), size);
    if (r <= 0) {
      out->error =
          r == 0 ? "the server closed the connection" : std::string("recv: ") + strerror(errno);
      break;
    }
    const uint64_t dt = NowNs() - t0;
    if (std::memcmp(tx.data(), rx.data(), size) != 0) {
      out->error = "the bytes that came back differ from those sent";
      break;
    }
    if (out->lat_ns.size() < out->lat_ns.capacity())
      out->lat_ns.push_back(static_cast<uint32_t>(std::min<uint64_t>(dt, UINT32_MAX)));
    ++out->count;
    ++seq;
  }
  // Clean close: our FIN, then the server's end of file (nothing more may come).
  if (out->error.empty()) {
    if (shutdown(fd, SHUT_WR) != 0) {
      out->error = std::string("shutdown: ") + strerror(errno);
    } else {
      uint8_t b;
      const ssize_t r = recv(fd, &b, 1, 0);
      if (r != 0)
        out->error = r > 0 ? "bytes after the last exchange"
                           : std::string("recv at close: ") + strerror(errno);
    }
  }
  close(fd);
  if (out->error.empty() && out->count == 0) out->error = "no exchange in the time given";
}

double CpuUs() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e6 + ru.ru_utime.tv_usec +
         ru.ru_stime.tv_usec;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: rr_load IP PORT CONNS SIZE SECONDS\n");
    return 2;
  }
  sockaddr_in a{};
  a.sin_family = AF_INET;
  const long port = std::strtol(argv[2], nullptr, 10);
  const long conns = std::strtol(argv[3], nullptr, 10);
  const long size = std::strtol(argv[4], nullptr, 10);
  const double seconds = std::strtod(argv[5], nullptr);
  if (inet_pton(AF_INET, argv[1], &a.sin_addr) != 1 || port < 1 || port > 65535 || conns < 1 ||
      conns > kMaxConns || size < 1 || static_cast<size_t>(size) > kMaxSize || !(seconds > 0) ||
      seconds > 3600) {
    std::fprintf(stderr, "rr_load: bad arguments\n");
    return 2;
  }
  a.sin_port = htons(static_cast<uint16_t>(port));
  std::vector<Result> results(conns);
  std::vector<std::thread> threads;
  const double cpu0 = CpuUs();
  const uint64_t start = NowNs();
  const uint64_t end = start + static_cast<uint64_t>(seconds * 1e9);
  for (long i = 0; i < conns; ++i)
    threads.emplace_back(Drive, a, static_cast<size_t>(size), end, static_cast<int>(i),
                         &results[i]);
  for (auto& t : threads) t.join();
  const double elapsed = (NowNs() - start) / 1e9;
  const double cpu = CpuUs() - cpu0;
  uint64_t total = 0;
  std::vector<uint32_t> lat;
  for (long i = 0; i < conns; ++i) {
    if (!results[i].error.empty()) {
      std::fprintf(stderr, "rr_load: connection %ld: %s\n", i, results[i].error.c_str());
      return 1;
    }
    total += results[i].count;
    lat.insert(lat.end(), results[i].lat_ns.begin(), results[i].lat_ns.end());
  }
  std::sort(lat.begin(), lat.end());
  auto pct = [&](double p) {
    return lat.empty() ? 0.0 : lat[static_cast<size_t>(p * (lat.size() - 1))] / 1e3;
  };
  std::printf(
      "rr_load: %ld connections %ld B: %.0f requests/s, p50 %.1f us, p99 %.1f us, %llu requests, "
      "cpu %.1f us a request\n",
      conns, size, total / elapsed, pct(0.5), pct(0.99), static_cast<unsigned long long>(total),
      cpu / static_cast<double>(total));
  return 0;
}
