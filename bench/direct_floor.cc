// The floor under a direct connection between two pod processes on different nodes: one
// TCP connection carrying frames as the data path does (ff::DirectStream: a 16-byte head, a
// body of at most one fragment, a 16-byte tag, sealed, opened in the receiver's buffer) and
// each body copied into a "registered" buffer, as the receiving library must before the
// bytes may land. No freeflow data path runs: this is what the design can reach on this machine,
// measured beside iperf3 and sockperf between the same pods (bench/multinode.sh).
//
//   direct_floor serve PORT MODE            one client, then exits (60 s without one: exit 2)
//   direct_floor bw    IP PORT MODE SECONDS  prints Gbit/s of body bytes
//   direct_floor lat   IP PORT MODE ITERS    prints the median one-way microseconds of 2 B
// MODE: auth (GMAC, body in clear), encrypt (AES-128-GCM).
// The client sends one byte first: 'b' or 'l'. The latency test's receivers poll the socket
// without sleeping, as a polling verbs program does.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "freeflow/direct_stream.h"

namespace {

constexpr uint32_t kFrag = 32 * 1024;

double NowS() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

[[noreturn]] void Die(const char* what) {
  perror(what);
  std::exit(1);
}

// One end: the stream, and the "registered" buffer received bodies are copied into.
struct End {
  std::unique_ptr<ff::DirectStream> s;
  std::vector<char> target = std::vector<char>(1 << 20);
  size_t target_off = 0;
};

void InitEnd(End* e, int fd, const std::string& mode, ff::DirectRole role) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  static uint8_t secret[ff::kDirectSecretBytes];
  memset(secret, 7, sizeof(secret));
  e->s = std::make_unique<ff::DirectStream>(ff::UniqueFd(fd));
  ff::DirectStream::Setup setup;
  setup.secret = &secret;
  setup.role = role;
  setup.mode = mode == "auth" ? ff::SealMode::kAuthenticate : ff::SealMode::kEncrypt;
  if (!e->s->Init(setup)) Die("stream");
}

// Lands every whole frame; returns how many (-1: the stream died).
int Take(End* e) {
  return e->s->Receive([e](const ff::direct::Head& h, char* body) {
    if (e->target_off + h.len > e->target.size()) e->target_off = 0;
    memcpy(e->target.data() + e->target_off, body, h.len);
    e->target_off += h.len;
    return true;
  });
}

void Put(End* e, const char* src, uint32_t len) {
  iovec v{const_cast<char*>(src), len};
  while (e->s->PutFrame(ff::direct::Type::kRecord, 1, 0, &v, 1) ==
         ff::DirectStream::Put::kFull) {
    pollfd p{e->s->fd(), POLLOUT, 0};
    poll(&p, 1, 1000);
    if (!e->s->Flush()) Die("flush");
  }
}

void FlushAll(End* e) {
  while (e->s->Flush() && e->s->unsent() > 0) {
    pollfd p{e->s->fd(), POLLOUT, 0};
    poll(&p, 1, 1000);
  }
}

void ServeLatency(End* e) {
  char msg[2] = {'p', 'q'};
  for (;;) {
    const int n = Take(e);
    if (n < 0) return;
    if (n == 0) continue;
    Put(e, msg, sizeof(msg));
    FlushAll(e);
  }
}

// Prints the rate the receiver saw, from its first frame to its last, on stderr (the
// sender's figure is the one the benchmark reports; the two agree within a socket buffer).
void ServeBandwidth(End* e) {
  uint64_t frames = 0;
  double first = 0, last = 0;
  for (;;) {
    pollfd p{e->s->fd(), POLLIN, 0};
    poll(&p, 1, 1000);
    const int n = Take(e);
    if (n < 0) break;
    if (n > 0 && frames == 0) first = NowS();
    if (n > 0) last = NowS();
    frames += static_cast<uint64_t>(n);
  }
  fprintf(stderr, "direct_floor: received %llu frames, %.2f Gbit/s (%s)\n",
          static_cast<unsigned long long>(frames),
          last > first ? static_cast<double>(frames) * kFrag * 8 / (last - first) / 1e9 : 0.0,
          e->s->why_dead());
}

int Serve(int port, const std::string& mode) {
  const int ls = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (bind(ls, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(ls, 1) != 0)
    Die("listen");
  pollfd p{ls, POLLIN, 0};
  if (poll(&p, 1, 60000) != 1) return 2;
  const int fd = accept(ls, nullptr, nullptr);
  if (fd < 0) Die("accept");
  char what = 0;
  if (recv(fd, &what, 1, MSG_WAITALL) != 1) Die("hello");
  End e;
  InitEnd(&e, fd, mode, ff::DirectRole::kAcceptor);
  if (what == 'l')
    ServeLatency(&e);
  else
    ServeBandwidth(&e);
  return 0;
}

int Dial(const char* ip, int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, ip, &a.sin_addr) != 1) Die("address");
  for (int i = 0; i < 100; ++i) {
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) return fd;
    usleep(20000);
  }
  Die("connect");
}

int Bandwidth(End* e, double seconds) {
  std::vector<char> src(1 << 20, 'x');
  uint64_t bytes = 0;
  size_t src_off = 0;
  const double t0 = NowS();
  while (NowS() - t0 < seconds) {
    // Two fragments, then a write: a 64 KiB WRITE.
    for (int i = 0; i < 2; ++i) {
      if (src_off + kFrag > src.size()) src_off = 0;
      Put(e, src.data() + src_off, kFrag);
      src_off += kFrag;
    }
    if (!e->s->Flush()) Die("flush");
    bytes += 2 * kFrag;
  }
  FlushAll(e);
  const double dt = NowS() - t0;
  shutdown(e->s->fd(), SHUT_WR);
  char c;
  while (recv(e->s->fd(), &c, 1, 0) > 0) {
  }
  printf("%.2f\n", static_cast<double>(bytes) * 8 / dt / 1e9);
  return 0;
}

int Latency(End* e, int iters) {
  std::vector<double> us;
  char msg[2] = {'p', 'i'};
  for (int i = 0; i < iters; ++i) {
    const double t0 = NowS();
    Put(e, msg, sizeof(msg));
    FlushAll(e);
    int n = 0;
    while ((n = Take(e)) == 0) {
    }
    if (n < 0) Die("receive");
    us.push_back((NowS() - t0) * 1e6 / 2);
  }
  std::sort(us.begin(), us.end());
  printf("%.2f\n", us[us.size() / 2]);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 4 && std::string(argv[1]) == "serve") return Serve(atoi(argv[2]), argv[3]);
  if (argc < 6) {
    fprintf(stderr, "usage: direct_floor serve PORT MODE | bw IP PORT MODE SECONDS | lat IP PORT MODE ITERS\n");
    return 2;
  }
  const int fd = Dial(argv[2], atoi(argv[3]));
  const bool bw = std::string(argv[1]) == "bw";
  if (send(fd, bw ? "b" : "l", 1, MSG_NOSIGNAL) != 1) Die("hello");
  End e;
  InitEnd(&e, fd, argv[4], ff::DirectRole::kDialler);
  if (bw) return Bandwidth(&e, atof(argv[5]));
  return Latency(&e, atoi(argv[5]));
}
