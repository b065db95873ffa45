#include "freeflow/metrics/exposition.h"

#include <fmt/format.h>

#include <cmath>
#include <stdexcept>

namespace ff::metrics {
namespace {

bool NameChar(char c, bool first, bool metric) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_') return true;
  if (metric && c == ':') return true;
  return !first && c >= '0' && c <= '9';
}

// A help text keeps to one line (backslash and newline escaped); a label value also escapes
// the double quote that would end it.
void AppendEscaped(std::string& out, std::string_view text, bool quote) {
  for (char c : text) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else if (c == '"' && quote)
      out += "\\\"";
    else
      out += c;
  }
}

}  // namespace

bool ValidName(std::string_view name, bool metric) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i)
    if (!NameChar(name[i], i == 0, metric)) return false;
  return true;
}

void Exposition::Family(std::string_view name, Kind kind, std::string_view help) {
  if (!ValidName(name, true))
    throw std::invalid_argument(fmt::format("bad metric name '{}'", name));
  if (kind == Kind::kCounter && !name.ends_with("_total"))
    throw std::invalid_argument(fmt::format("counter '{}' does not end in _total", name));
  family_ = name;
  kind_ = kind;
  out_ += "# HELP ";
  out_ += name;
  out_ += ' ';
  AppendEscaped(out_, help, false);
  out_ += "\n# TYPE ";
  out_ += name;
  out_ += kind == Kind::kCounter ? " counter\n"
          : kind == Kind::kGauge ? " gauge\n"
                                 : " histogram\n";
}

void Exposition::Series(std::string_view suffix, std::initializer_list<Label> labels,
                        const Label* extra) {
  if (family_.empty()) throw std::logic_error("a sample before its family");
  out_ += family_;
  out_ += suffix;
  char sep = '{';
  auto put = [&](const Label& l) {
    if (!ValidName(l.name, false) || l.name.starts_with("__"))
      throw std::invalid_argument(fmt::format("bad label name '{}'", l.name));
    out_ += sep;
    out_ += l.name;
    out_ += "=\"";
    AppendEscaped(out_, l.value, true);
    out_ += '"';
    sep = ',';
  };
  for (const Label& l : labels) put(l);
  if (extra != nullptr) put(*extra);
  if (sep == ',') out_ += '}';
}

void Exposition::Value(uint64_t v) { fmt::format_to(std::back_inserter(out_), " {}\n", v); }

void Exposition::Value(double v) {
  if (std::isnan(v))
    out_ += " NaN\n";
  else if (std::isinf(v))
    out_ += v > 0 ? " +Inf\n" : " -Inf\n";
  else
    fmt::format_to(std::back_inserter(out_), " {}\n", v);
}

void Exposition::Sample(std::initializer_list<Label> labels, uint64_t value) {
  if (kind_ == Kind::kHistogram) throw std::logic_error("a histogram's sample without buckets");
  Series("", labels);
  Value(value);
}

void Exposition::Sample(std::initializer_list<Label> labels, double value) {
  if (kind_ == Kind::kHistogram) throw std::logic_error("a histogram's sample without buckets");
  Series("", labels);
  Value(value);
}

void Exposition::Histogram(std::initializer_list<Label> labels, std::span<const double> bounds,
                           std::span<const uint64_t> le, uint64_t count, double sum) {
  if (kind_ != Kind::kHistogram) throw std::logic_error("buckets in a family not a histogram");
  if (bounds.size() != le.size()) throw std::invalid_argument("buckets and counts differ");
  for (size_t i = 0; i < bounds.size(); ++i) {
    const std::string bound = fmt::format("{}", bounds[i]);
    const Label at{"le", bound};
    Series("_bucket", labels, &at);
    Value(le[i]);
  }
  const Label inf{"le", "+Inf"};
  Series("_bucket", labels, &inf);
  Value(count);
  Series("_sum", labels);
  Value(sum);
  Series("_count", labels);
  Value(count);
}

}  // namespace ff::metrics
