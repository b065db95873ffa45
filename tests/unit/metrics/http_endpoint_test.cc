// The endpoint as scrapers and hostile clients meet it: GET /metrics answered with what the
// rendering returns, other paths and methods refused, a rendering that cannot answer a 503,
// and clients that hold connections open cost the others nothing.
#include "freeflow/metrics/http_endpoint.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <vector>

#include "scrape.h"

namespace ff::metrics {
namespace {

constexpr uint32_t kScraper = 0x7f000001;  // 127.0.0.1
constexpr uint32_t kFlooder = 0x7f000002;  // 127.0.0.2: another client of the loopback

TEST(HttpEndpoint, AnswersMetricsAndRefusesTheRest) {
  std::atomic<int> renders{0};
  HttpEndpoint endpoint;
  std::string error;
  ASSERT_TRUE(endpoint.Start(
      "127.0.0.1:0",
      [&]() -> std::optional<std::string> {
        ++renders;
        return std::string("ff_up 1\n");
      },
      &error))
      << error;
  ASSERT_NE(endpoint.port(), 0);
  auto ok = test::HttpRequest(endpoint.port(), "GET", "/metrics");
  EXPECT_EQ(ok.status, 200);
  EXPECT_EQ(ok.body, "ff_up 1\n");
  EXPECT_EQ(test::HttpRequest(endpoint.port(), "GET", "/").status, 404);
  EXPECT_EQ(test::HttpRequest(endpoint.port(), "GET", "/metrics/../etc/passwd").status, 404);
  EXPECT_EQ(test::HttpRequest(endpoint.port(), "POST", "/metrics").status, 405);
  EXPECT_EQ(test::HttpRequest(endpoint.port(), "DELETE", "/metrics").status, 405);
  EXPECT_EQ(renders.load(), 1);
  const uint16_t port = endpoint.port();
  endpoint.Stop();
  EXPECT_EQ(test::HttpRequest(port, "GET", "/metrics").status, 0);
}

TEST(HttpEndpoint, NoAnswerIsServiceUnavailable) {
  HttpEndpoint endpoint;
  std::string error;
  ASSERT_TRUE(endpoint.Start(
      "localhost:0", []() -> std::optional<std::string> { return std::nullopt; }, &error));
  EXPECT_EQ(test::HttpRequest(endpoint.port(), "GET", "/metrics").status, 503);
  ASSERT_TRUE(endpoint.Start(
      "localhost:0",
      []() -> std::optional<std::string> { throw std::runtime_error("render failed"); }, &error));
  EXPECT_EQ(test::HttpRequest(endpoint.port(), "GET", "/metrics").status, 503);
}

TEST(HttpEndpoint, BadAddressesFailWithAReason) {
  HttpEndpoint endpoint;
  std::string error;
  for (const char* bad :
       {"9100", "host.example:9100", "127.0.0.1:99999", "127.0.0.1:x", "127.0.0.1:"}) {
    EXPECT_FALSE(endpoint.Start(
        bad, [] { return std::optional<std::string>(""); }, &error))
        << bad;
    EXPECT_FALSE(error.empty()) << bad;
  }
  ASSERT_TRUE(endpoint.Start(
      "127.0.0.1:0", [] { return std::optional<std::string>(""); }, &error));
  HttpEndpoint second;
  const std::string taken = "127.0.0.1:" + std::to_string(endpoint.port());
  EXPECT_FALSE(second.Start(
      taken, [] { return std::optional<std::string>(""); }, &error));
  EXPECT_NE(error.find(taken), std::string::npos) << error;
}

// A client (a pod can reach the node's address) that opens every connection it can and
// sends nothing gets its share; another client's scrape is answered.
TEST(HttpEndpoint, IdleConnectionsOfOneClientDoNotStopOthers) {
  HttpEndpoint endpoint;
  std::string error;
  ASSERT_TRUE(endpoint.Start(
      "0.0.0.0:0", [] { return std::optional<std::string>("ff_up 1\n"); }, &error));
  std::vector<int> idle;
  for (unsigned i = 0; i < HttpEndpoint::kConnectionLimit + 4; ++i) {
    const int fd = test::HttpIdleConnection(endpoint.port(), kFlooder);
    if (fd >= 0) idle.push_back(fd);
  }
  EXPECT_EQ(idle.size(), HttpEndpoint::kConnectionLimit + 4);  // the kernel took them all
  const auto answer = test::HttpRequest(endpoint.port(), "GET", "/metrics", kScraper);
  EXPECT_EQ(answer.status, 200);
  EXPECT_EQ(answer.body, "ff_up 1\n");
  for (int fd : idle) ::close(fd);
}

}  // namespace
}  // namespace ff::metrics
