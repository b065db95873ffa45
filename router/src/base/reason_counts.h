// Refusals counted by reason, for metrics (docs/metrics.md): a fixed set of reasons, each
// named by the code that refuses and never by anything a peer sent, so that a peer cannot
// grow the set of series. Thread-safe: a gate counts on its thread, the loop renders.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace ff::router {

// Reason is an enum whose values are 0 .. N-1; names[i] names value i.
template <typename Reason, size_t N>
class ReasonCounts {
 public:
  explicit constexpr ReasonCounts(const std::array<const char*, N>& names) : names_(names) {}

  void Note(Reason r) { counts_[Index(r)].fetch_add(1, std::memory_order_relaxed); }
  uint64_t count(Reason r) const { return counts_[Index(r)].load(std::memory_order_relaxed); }
  uint64_t total() const {
    uint64_t sum = 0;
    for (const auto& c : counts_) sum += c.load(std::memory_order_relaxed);
    return sum;
  }
  // f(name, count) for every reason, those never counted included (a counter starts at 0).
  template <typename F>
  void ForEach(F&& f) const {
    for (size_t i = 0; i < N; ++i) f(names_[i], counts_[i].load(std::memory_order_relaxed));
  }

 private:
  static constexpr size_t Index(Reason r) { return static_cast<size_t>(r); }
  std::array<const char*, N> names_;
  std::array<std::atomic<uint64_t>, N> counts_{};
};

}  // namespace ff::router
