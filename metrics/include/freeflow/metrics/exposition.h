// The Prometheus text exposition format (version 0.0.4), written: metric families, each a
// HELP and TYPE line and its samples. Shared by ffrouter and rdma-device-plugin; what they
// expose is in docs/metrics.md.
//
// Names are checked when written (a bad one is a programming error: it throws
// std::invalid_argument); label values and help texts are escaped, so values taken from
// pods (a pod's name) cannot break the format. Not thread-safe: one writer per rendering.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>
#include <utility>

namespace ff::metrics {

enum class Kind : uint8_t { kCounter, kGauge, kHistogram };

struct Label {
  std::string_view name;
  std::string_view value;
};

class Exposition {
 public:
  // Starts a family. A counter's name ends in `_total`, as the format's conventions ask; a
  // histogram's samples are written by Histogram().
  void Family(std::string_view name, Kind kind, std::string_view help);
  // A sample of the current family (the family's name; labels in the order given).
  void Sample(std::initializer_list<Label> labels, uint64_t value);
  void Sample(std::initializer_list<Label> labels, double value);
  void Sample(uint64_t value) { Sample({}, value); }
  // A histogram family's series: `le[i]` observations no larger than `bounds[i]` (cumulative,
  // bounds ascending), `count` in all, of sum `sum`; the +Inf bucket is `count`.
  void Histogram(std::initializer_list<Label> labels, std::span<const double> bounds,
                 std::span<const uint64_t> le, uint64_t count, double sum);
  // Room for `bytes` of text, so that a large rendering (the last one's size) is not copied
  // as it grows.
  void Reserve(size_t bytes) { out_.reserve(bytes); }
  // The text written so far; the writer is empty afterwards.
  std::string Take() { return std::exchange(out_, {}); }

 private:
  // The family's name with `suffix`, then the labels and `extra` (a histogram's "le").
  void Series(std::string_view suffix, std::initializer_list<Label> labels,
              const Label* extra = nullptr);
  void Value(uint64_t v);
  void Value(double v);
  std::string out_;
  std::string family_;
  Kind kind_ = Kind::kGauge;
};

// True when `name` is a valid metric or label name ([a-zA-Z_][a-zA-Z0-9_]*; metric names
// may also hold ':').
bool ValidName(std::string_view name, bool metric);

}  // namespace ff::metrics
