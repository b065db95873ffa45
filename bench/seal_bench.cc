// The cost of sealing and opening one frame of a direct connection (core/src/frame_seal.cc),
// by each of the three implementations FrameCipher chooses between, over bodies from a small
// message's to the largest fragment's: the vector code where the CPU has it, else the
// portable pair, where nettle's lower set-up pays and where OpenSSL's throughput does
// (FrameCipher::kSmallBody). bench/direct.sh prints the medians beside each other.
// BM_MessageWithAnswer: what one small message and the answer that travels with it cost
// through a DirectStream pair, written, received and opened, sealed as two frames (a peer
// that takes no batches) and as one batch.
#include <benchmark/benchmark.h>
#include <sys/socket.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "freeflow/direct_stream.h"
#include "freeflow/frame_seal.h"
#include "freeflow/protocol/direct_wire.h"

namespace {

// range(0): body bytes; range(1): the implementation, 0 nettle, 1 OpenSSL, 2 the vector code
// (false when this CPU has none).
bool Use(ff::FrameCipher& c, int64_t impl) {
  if (!c.set_engine(impl == 2 ? ff::FrameCipher::Engine::kVector
                              : ff::FrameCipher::Engine::kPortable))
    return false;
  c.set_small_body_limit(impl == 0 ? SIZE_MAX : 0);
  return true;
}

void BM_Seal(benchmark::State& state) {
  uint8_t secret[ff::kDirectSecretBytes];
  if (!ff::NewDirectSecret(secret)) return state.SkipWithError("no random source");
  ff::FrameCipher tx;
  tx.Init(secret, ff::DirectRole::kDialler, ff::FrameCipher::Direction::kSend,
          ff::SealMode::kEncrypt);
  if (!Use(tx, state.range(1))) return state.SkipWithError("no vector code on this CPU");
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
  if (!Use(rx, state.range(1))) return state.SkipWithError("no vector code on this CPU");
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

// range(0): 1 when the sender heard that its peer takes batches. The bodies are those of
// an 8-byte SEND's record (RecordHeader, ProxyRequest, data: 80 bytes) and of the response
// to the message before it (RecordHeader, ProxyResponse: 48), as UCX's tag_lat sends them.
void BM_MessageWithAnswer(benchmark::State& state) {
  uint8_t secret[ff::kDirectSecretBytes];
  int sv[2];
  if (!ff::NewDirectSecret(secret) || ::socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
    return state.SkipWithError("set-up");
  ff::DirectStream a{ff::UniqueFd(sv[0])}, b{ff::UniqueFd(sv[1])};
  ff::DirectStream::Setup s;
  s.secret = &secret;
  s.role = ff::DirectRole::kDialler;
  if (!a.Init(s)) return state.SkipWithError("init");
  s.role = ff::DirectRole::kAcceptor;
  if (!b.Init(s)) return state.SkipWithError("init");
  auto take = [](ff::DirectStream& to, int frames) {
    for (int got = 0, i = 0; got < frames && i < 1000; ++i) {
      const int n = to.Receive([](const ff::direct::Head&, char*) { return true; });
      if (n < 0) return false;
      got += n;
    }
    return true;
  };
  if (state.range(0) != 0) {  // b says, in a frame of its own, that it takes batches
    const ff::direct::Credit credit{0};
    const iovec v{const_cast<ff::direct::Credit*>(&credit), sizeof(credit)};
    b.PutFrame(ff::direct::Type::kCredit, 0, 0, &v, 1);
    if (!b.Flush() || !take(a, 1) || !a.peer_takes_batches()) return state.SkipWithError("hello");
  }
  char record[80] = {}, answer[48] = {};
  const iovec r{record, sizeof(record)}, q{answer, sizeof(answer)};
  for (auto _ : state) {
    a.PutFrame(ff::direct::Type::kResp, 1, 0, &q, 1, ff::DirectStream::Priority::kAnswer);
    a.PutFrame(ff::direct::Type::kRecord, 1, 0, &r, 1);
    if (!a.Flush() || !take(b, 2)) return state.SkipWithError("stream");
  }
}
BENCHMARK(BM_MessageWithAnswer)
    ->Arg(0)
    ->Arg(1)
    ->ArgName("batches")
    ->Repetitions(5)
    ->ReportAggregatesOnly(true);

void Sizes(benchmark::internal::Benchmark* b) {
  for (int64_t n : {96, 512, 768, 1024, 2048, 32768, 65536})
    for (int64_t impl : {0, 1, 2}) b->Args({n, impl});
  b->ArgNames({"body", "impl"})->Repetitions(5)->ReportAggregatesOnly(true);
}
BENCHMARK(BM_Seal)->Apply(Sizes);
BENCHMARK(BM_Open)->Apply(Sizes);

}  // namespace

BENCHMARK_MAIN();
