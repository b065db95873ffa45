// The cost of sealing and opening one frame of a direct connection (core/src/frame_seal.cc),
// by each of the two implementations FrameCipher chooses between, over bodies from a small
// message's to the largest fragment's: where the small-frame implementation's lower set-up
// pays and where the other's throughput does (FrameCipher::kSmallBody). bench/direct.sh
// prints the medians beside each other.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "freeflow/frame_seal.h"
#include "freeflow/protocol/direct_wire.h"

namespace {

// range(0): body bytes; range(1): 1 for the small-frame implementation, 0 for the other.
void Limit(ff::FrameCipher& c, int64_t small) { c.set_small_body_limit(small != 0 ? SIZE_MAX : 0); }

void BM_Seal(benchmark::State& state) {
  uint8_t secret[ff::kDirectSecretBytes];
  if (!ff::NewDirectSecret(secret)) return state.SkipWithError("no random source");
  ff::FrameCipher tx;
  tx.Init(secret, ff::DirectRole::kDialler, ff::FrameCipher::Direction::kSend,
          ff::SealMode::kEncrypt);
  Limit(tx, state.range(1));
  const auto n = static_cast<size_t>(state.range(0));
  std::vector<char> body(n, 'b'), out(n);
  const ff::direct::Head head{static_cast<uint32_t>(n), ff::direct::Type::kRecord, 0, 1, 0};
  uint8_t tag[ff::kSealTagBytes];
  for (auto _ : state) {
    const iovec v{body.data(), n};
    if (!tx.Seal(&head, sizeof(head), &v, 1, out.data(), tag)) return state.SkipWithError("seal");
    benchmark::DoNotOptimize(tag);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * state.range(0));
}

void BM_Open(benchmark::State& state) {
  uint8_t secret[ff::kDirectSecretBytes];
  if (!ff::NewDirectSecret(secret)) return state.SkipWithError("no random source");
  ff::FrameCipher tx, rx;
  tx.Init(secret, ff::DirectRole::kDialler, ff::FrameCipher::Direction::kSend,
          ff::SealMode::kEncrypt);
  rx.Init(secret, ff::DirectRole::kAcceptor, ff::FrameCipher::Direction::kReceive,
          ff::SealMode::kEncrypt);
  Limit(rx, state.range(1));
  const auto n = static_cast<size_t>(state.range(0));
  const ff::direct::Head head{static_cast<uint32_t>(n), ff::direct::Type::kRecord, 0, 1, 0};
  // Frames open once each, in order: a batch is sealed ahead, outside the timing.
  constexpr size_t kBatch = 256;
  std::vector<char> body(n, 'b'), frames(kBatch * n);
  struct Tag {
    uint8_t b[ff::kSealTagBytes];
  };
  std::vector<Tag> tags(kBatch);
  size_t next = kBatch;
  for (auto _ : state) {
    if (next == kBatch) {
      state.PauseTiming();
      for (size_t i = 0; i < kBatch; ++i) {
        const iovec v{body.data(), n};
        tx.Seal(&head, sizeof(head), &v, 1, frames.data() + i * n, tags[i].b);
      }
      next = 0;
      state.ResumeTiming();
    }
    if (!rx.Open(&head, sizeof(head), frames.data() + next * n, n, tags[next].b))
      return state.SkipWithError("open");
    ++next;
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * state.range(0));
}

void Sizes(benchmark::internal::Benchmark* b) {
  for (int64_t n : {96, 512, 768, 1024, 2048, 32768})
    for (int64_t small : {1, 0}) b->Args({n, small});
  b->ArgNames({"body", "small"})->Repetitions(5)->ReportAggregatesOnly(true);
}
BENCHMARK(BM_Seal)->Apply(Sizes);
BENCHMARK(BM_Open)->Apply(Sizes);

}  // namespace

BENCHMARK_MAIN();
