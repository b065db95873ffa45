// The cost of one wake-up between two processes: a ping-pong over two eventfds, each side
// blocked in read() until the other writes. Half a round trip is what an event-driven
// verbs program pays per message on top of polling (bench/qperf.sh compares them).
#include <benchmark/benchmark.h>
#include <sys/eventfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>

static void BM_EventfdPingPong(benchmark::State& state) {
  const int ping = ::eventfd(0, EFD_CLOEXEC);
  const int pong = ::eventfd(0, EFD_CLOEXEC);
  if (ping < 0 || pong < 0) {
    state.SkipWithError("eventfd failed");
    return;
  }
  const pid_t child = ::fork();
  if (child == 0) {  // echoes until the parent closes its ends (a read of 0 means never)
    uint64_t v = 0;
    while (::read(ping, &v, sizeof(v)) == sizeof(v) && v != UINT64_MAX - 1) {
      if (::write(pong, &v, sizeof(v)) != sizeof(v)) break;
    }
    ::_exit(0);
  }
  uint64_t one = 1, got = 0;
  for (auto _ : state) {
    if (::write(ping, &one, sizeof(one)) != sizeof(one) ||
        ::read(pong, &got, sizeof(got)) != sizeof(got)) {
      state.SkipWithError("eventfd ping-pong broke");
      break;
    }
  }
  const uint64_t stop = UINT64_MAX - 1;  // the child's signal to leave
  [[maybe_unused]] ssize_t n = ::write(ping, &stop, sizeof(stop));
  ::waitpid(child, nullptr, 0);
  ::close(ping);
  ::close(pong);
}
BENCHMARK(BM_EventfdPingPong)
    ->Iterations(20000)
    ->UseRealTime()
    ->Repetitions(5)
    ->ReportAggregatesOnly(false);

BENCHMARK_MAIN();
