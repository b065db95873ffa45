// Single-thread memcpy of a fixed size: the baseline the freeflow data path is judged
// against (a same-node RDMA WRITE is, at best, one memcpy into the peer's memory).
#include <benchmark/benchmark.h>

#include <cstring>
#include <vector>

static void BM_Memcpy(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  std::vector<char> src(n, 1), dst(n, 0);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), n);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(n));
}
BENCHMARK(BM_Memcpy)->Arg(64 * 1024)->Repetitions(5)->ReportAggregatesOnly(false);

BENCHMARK_MAIN();
