// What one more process on the path costs on this machine: the floor under any design in
// which a router, not the receiving pod, takes the bytes off the wire. Each iteration is
// one round trip of a 16-byte message between two "pods" (processes) over loopback TCP:
//   BM_Tcp        A <-TCP-> B                                   what sockperf measures
//   BM_OneRelay   A -TCP-> relay -shm+eventfd-> B, and back     the receiving router only
//   BM_TwoRelays  A -shm+eventfd-> relay -TCP-> relay -shm+eventfd-> B, and back
//                                                               freeflow's cross-node path
// One-way latency is half the reported time per iteration. Helpers are processes this
// benchmark forks and kills by PID; every wait gives up after 2 s.
#include <benchmark/benchmark.h>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <vector>

namespace {

constexpr int kTimeoutMs = 2000;

// A word one process publishes and another sleeps on (the pod <-> router hand-off).
struct Box {
  std::atomic<uint64_t> seq{0};
  int efd = -1;
};

void Ring(int efd) {
  const uint64_t one = 1;
  if (::write(efd, &one, sizeof(one)) != sizeof(one)) std::_Exit(3);
}

void Publish(Box* b, uint64_t v) {
  b->seq.store(v, std::memory_order_release);
  Ring(b->efd);
}

// Sleeps until `b` reaches `want`; false after kTimeoutMs without progress.
bool Await(Box* b, uint64_t want) {
  while (b->seq.load(std::memory_order_acquire) < want) {
    pollfd p{b->efd, POLLIN, 0};
    if (::poll(&p, 1, kTimeoutMs) <= 0) return false;
    uint64_t v;
    if (::read(b->efd, &v, sizeof(v)) < 0) return false;
  }
  return true;
}

bool SendSeq(int fd, uint64_t v) {
  uint64_t msg[2] = {v, 0};
  return ::send(fd, msg, sizeof(msg), MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof(msg));
}

bool RecvSeq(int fd, uint64_t* v) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, kTimeoutMs) <= 0) return false;
  uint64_t msg[2];
  if (::recv(fd, msg, sizeof(msg), MSG_WAITALL) != static_cast<ssize_t>(sizeof(msg))) return false;
  *v = msg[0];
  return true;
}

// A connected loopback TCP pair with Nagle off, as the routers and sockperf use.
bool TcpPair(int fds[2]) {
  const int l = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  bool ok = l >= 0 && ::bind(l, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
            ::getsockname(l, reinterpret_cast<sockaddr*>(&a), &len) == 0 && ::listen(l, 1) == 0;
  fds[0] = ok ? ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0) : -1;
  ok = ok && fds[0] >= 0 && ::connect(fds[0], reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  fds[1] = ok ? ::accept4(l, nullptr, nullptr, SOCK_CLOEXEC) : -1;
  if (l >= 0) ::close(l);
  const int one = 1;
  for (int i = 0; i < 2 && ok; ++i)
    ok = fds[i] >= 0 && ::setsockopt(fds[i], IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) == 0;
  return ok;
}

// A router: moves what its pod publishes in `from_pod` onto `tx` (when given), and what
// arrives on `rx` into `to_pod`. Exits after kTimeoutMs of silence or on a broken socket.
[[noreturn]] void Relay(int rx, int tx, Box* from_pod, Box* to_pod) {
  const int ep = ::epoll_create1(0);
  epoll_event e{};
  e.events = EPOLLIN;
  e.data.u32 = 0;
  ::epoll_ctl(ep, EPOLL_CTL_ADD, rx, &e);
  if (from_pod != nullptr) {
    e.data.u32 = 1;
    ::epoll_ctl(ep, EPOLL_CTL_ADD, from_pod->efd, &e);
  }
  uint64_t forwarded = 0;
  for (;;) {
    epoll_event ev[2];
    const int n = ::epoll_wait(ep, ev, 2, kTimeoutMs);
    if (n <= 0) std::_Exit(0);
    for (int i = 0; i < n; ++i) {
      if (ev[i].data.u32 == 0) {
        uint64_t v;
        if (!RecvSeq(rx, &v)) std::_Exit(0);
        Publish(to_pod, v);
      } else {
        uint64_t drained;
        if (::read(from_pod->efd, &drained, sizeof(drained)) < 0) std::_Exit(2);
        const uint64_t s = from_pod->seq.load(std::memory_order_acquire);
        while (forwarded < s)
          if (!SendSeq(tx, ++forwarded)) std::_Exit(0);
      }
    }
  }
}

enum class Path { kTcp, kOneRelay, kTwoRelays };

void RoundTrips(benchmark::State& state, Path path) {
  // Boxes: 0 = pod A's inbox, 1 = pod B's inbox, 2 = A's outbox, 3 = B's outbox.
  auto* box = static_cast<Box*>(
      ::mmap(nullptr, 4 * sizeof(Box), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  int ab[2], ba[2];  // A's node -> B's node and back
  if (box == MAP_FAILED || !TcpPair(ab) || !TcpPair(ba)) {
    state.SkipWithError("cannot set up sockets or shared memory");
    return;
  }
  for (int i = 0; i < 4; ++i) {
    new (&box[i]) Box();
    box[i].efd = ::eventfd(0, EFD_CLOEXEC);
  }
  std::vector<pid_t> helpers;
  auto spawn = [&](auto body) {
    const pid_t p = ::fork();
    if (p == 0) {
      body();
      std::_Exit(0);
    }
    helpers.push_back(p);
  };
  const bool relayed = path != Path::kTcp;
  const bool pods_use_shm = path == Path::kTwoRelays;
  if (relayed) {
    // B's router receives A's messages; A's router receives B's.
    spawn([&] { Relay(ab[1], ba[0], pods_use_shm ? &box[3] : nullptr, &box[1]); });
    spawn([&] { Relay(ba[1], ab[0], pods_use_shm ? &box[2] : nullptr, &box[0]); });
  }
  // Pod B: answers every message.
  spawn([&] {
    for (uint64_t i = 1;; ++i) {
      uint64_t v = i;
      const bool got = relayed ? Await(&box[1], i) : RecvSeq(ab[1], &v);
      if (!got) std::_Exit(0);
      const bool sent = pods_use_shm ? (Publish(&box[3], i), true) : SendSeq(ba[0], i);
      if (!sent) std::_Exit(0);
    }
  });
  uint64_t i = 0;
  for (auto _ : state) {
    ++i;
    if (pods_use_shm) {
      Publish(&box[2], i);
    } else if (!SendSeq(ab[0], i)) {
      state.SkipWithError("send failed");
      break;
    }
    uint64_t v = i;
    if (!(relayed ? Await(&box[0], i) : RecvSeq(ba[1], &v))) {
      state.SkipWithError("no answer within 2 s");
      break;
    }
  }
  for (pid_t p : helpers) ::kill(p, SIGKILL);
  for (pid_t p : helpers) ::waitpid(p, nullptr, 0);
  for (int fd : {ab[0], ab[1], ba[0], ba[1]}) ::close(fd);
  for (int k = 0; k < 4; ++k) ::close(box[k].efd);
  ::munmap(box, 4 * sizeof(Box));
}

void BM_Tcp(benchmark::State& s) { RoundTrips(s, Path::kTcp); }
void BM_OneRelay(benchmark::State& s) { RoundTrips(s, Path::kOneRelay); }
void BM_TwoRelays(benchmark::State& s) { RoundTrips(s, Path::kTwoRelays); }

}  // namespace

BENCHMARK(BM_Tcp)->Iterations(5000)->Repetitions(5)->UseRealTime();
BENCHMARK(BM_OneRelay)->Iterations(5000)->Repetitions(5)->UseRealTime();
BENCHMARK(BM_TwoRelays)->Iterations(5000)->Repetitions(5)->UseRealTime();

BENCHMARK_MAIN();
