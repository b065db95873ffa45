// The text format as Prometheus reads it: families, escaping of what pods may name, the
// checks on names, histograms; promtool reads what the writer wrote.
#include "freeflow/metrics/exposition.h"

#include <gtest/gtest.h>

#include <array>
#include <stdexcept>

#include "scrape.h"

namespace ff::metrics {
namespace {

TEST(Exposition, WritesFamiliesThatPromtoolAccepts) {
  Exposition out;
  out.Family("ff_test_things", Kind::kGauge, "Things held.");
  out.Sample({{"pod", "10.0.0.1"}, {"kind", "qp"}}, uint64_t{3});
  out.Sample({{"pod", "10.0.0.2"}, {"kind", "qp"}}, uint64_t{0});
  out.Family("ff_test_events_total", Kind::kCounter, "Events seen.");
  out.Sample(uint64_t{42});
  out.Family("ff_test_busy_seconds_total", Kind::kCounter, "Busy time.");
  out.Sample({}, 1.5);
  const std::string text = out.Take();
  EXPECT_EQ(text,
            "# HELP ff_test_things Things held.\n"
            "# TYPE ff_test_things gauge\n"
            "ff_test_things{pod=\"10.0.0.1\",kind=\"qp\"} 3\n"
            "ff_test_things{pod=\"10.0.0.2\",kind=\"qp\"} 0\n"
            "# HELP ff_test_events_total Events seen.\n"
            "# TYPE ff_test_events_total counter\n"
            "ff_test_events_total 42\n"
            "# HELP ff_test_busy_seconds_total Busy time.\n"
            "# TYPE ff_test_busy_seconds_total counter\n"
            "ff_test_busy_seconds_total 1.5\n");
  std::string report;
  EXPECT_EQ(test::PromtoolCheck(text, &report), 0) << report;
  EXPECT_TRUE(out.Take().empty());
}

// A label value comes from outside (a pod's name): quotes, backslashes and newlines in it
// cannot end the value, the line or the sample.
TEST(Exposition, EscapesLabelValuesAndHelp) {
  Exposition out;
  out.Family("ff_test_named", Kind::kGauge, "Help with \\ and\na second line.");
  out.Sample({{"pod", "a\"b\\c\nff_test_named{pod=\"forged\"} 99"}}, uint64_t{1});
  const std::string text = out.Take();
  EXPECT_NE(text.find("# HELP ff_test_named Help with \\\\ and\\na second line.\n"),
            std::string::npos)
      << text;
  EXPECT_NE(
      text.find("ff_test_named{pod=\"a\\\"b\\\\c\\nff_test_named{pod=\\\"forged\\\"} 99\"} 1\n"),
      std::string::npos)
      << text;
  // One sample line and the two comment lines: nothing forged a line of its own.
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 3) << text;
  std::string report;
  EXPECT_EQ(test::PromtoolCheck(text, &report), 0) << report;
}

TEST(Exposition, RefusesBadNames) {
  Exposition out;
  EXPECT_THROW(out.Family("9lives", Kind::kGauge, "x"), std::invalid_argument);
  EXPECT_THROW(out.Family("has-dash", Kind::kGauge, "x"), std::invalid_argument);
  EXPECT_THROW(out.Family("ff_events", Kind::kCounter, "x"), std::invalid_argument);
  EXPECT_THROW(out.Sample(uint64_t{1}), std::logic_error);  // no family yet
  out.Family("ff_ok", Kind::kGauge, "x");
  EXPECT_THROW(out.Sample({{"bad label", "v"}}, uint64_t{1}), std::invalid_argument);
  EXPECT_THROW(out.Sample({{"__reserved", "v"}}, uint64_t{1}), std::invalid_argument);
  EXPECT_TRUE(ValidName("ff:recorded_rule", true));
  EXPECT_FALSE(ValidName("ff:recorded_rule", false));
}

TEST(Exposition, WritesHistograms) {
  Exposition out;
  out.Family("ff_test_turn_seconds", Kind::kHistogram, "Turns.");
  const std::array<double, 2> bounds = {0.001, 0.1};
  const std::array<uint64_t, 2> le = {5, 7};
  out.Histogram({{"loop", "main"}}, bounds, le, 8, 1.25);
  EXPECT_THROW(out.Sample(uint64_t{1}), std::logic_error);
  const std::string text = out.Take();
  EXPECT_NE(text.find("ff_test_turn_seconds_bucket{loop=\"main\",le=\"0.001\"} 5\n"
                      "ff_test_turn_seconds_bucket{loop=\"main\",le=\"0.1\"} 7\n"
                      "ff_test_turn_seconds_bucket{loop=\"main\",le=\"+Inf\"} 8\n"
                      "ff_test_turn_seconds_sum{loop=\"main\"} 1.25\n"
                      "ff_test_turn_seconds_count{loop=\"main\"} 8\n"),
            std::string::npos)
      << text;
  std::string report;
  EXPECT_EQ(test::PromtoolCheck(text, &report), 0) << report;
}

}  // namespace
}  // namespace ff::metrics
