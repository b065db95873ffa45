// The router's /metrics as a scraper sees it (docs/metrics.md): what pods hold and the quota
// refusals they met move the figures, promtool accepts the text, and a stalled loop gets the
// scrape a 503 instead of stalling the scraper for ever.
#include <gtest/gtest.h>
#include <infiniband/verbs.h>

#include <chrono>
#include <future>
#include <regex>
#include <thread>

#include "harness.h"
#include "scrape.h"

namespace ff::router::test {
namespace {

TestRouter::Options Scraped(PodLimits limits = DefaultPodLimits()) {
  TestRouter::Options o;
  o.limits = limits;
  o.metrics_address = "127.0.0.1:0";
  return o;
}

std::string Scrape(TestRouter& router) {
  const auto answer = ff::test::HttpRequest(router.MetricsPort(), "GET", "/metrics");
  EXPECT_EQ(answer.status, 200);
  return answer.body;
}

using ff::test::SampleValue;

// Scrapes until `series` has `want` (the router's thread answers between requests).
bool WaitForValue(TestRouter& router, const std::string& series, double want) {
  for (int i = 0; i < 200; ++i) {
    if (SampleValue(Scrape(router), series) == want) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

TEST(RouterMetricsTest, PodsHoldingsAndRefusalsMoveTheFigures) {
  TestRouter router(Scraped(WithLimits({{Quota::kQps, 2}})));
  ASSERT_NE(router.MetricsPort(), 0);
  std::string text = Scrape(router);
  EXPECT_EQ(SampleValue(text, "freeflow_router_sessions"), 0) << text;
  EXPECT_EQ(SampleValue(text, "freeflow_router_quota_refusals_total{quota=\"qps\"}"), 0);
  EXPECT_EQ(SampleValue(text, "freeflow_router_pod_limit{resource=\"qps\"}"), 2);
  EXPECT_EQ(SampleValue(text, "freeflow_router_pod_limit_bytes{resource=\"mapped\"}"),
            kDefaultPodMappedMiB * double(1 << 20));
  {
    RawPod pod(router, Ip("10.0.0.1"));
    ASSERT_EQ(pod.Hello(), 0);
    ASSERT_EQ(pod.CreateQp(IBV_QPT_RC).status, 0);
    ASSERT_EQ(pod.CreateQp(IBV_QPT_RC).status, 0);
    EXPECT_EQ(pod.CreateQp(IBV_QPT_RC).status, ENOSPC);
    text = Scrape(router);
    EXPECT_EQ(SampleValue(text, "freeflow_router_sessions"), 1) << text;
    EXPECT_EQ(SampleValue(text, "freeflow_router_pods"), 1);
    EXPECT_EQ(SampleValue(text, "freeflow_router_qps"), 2);
    EXPECT_EQ(SampleValue(text, "freeflow_router_pod_held{address=\"10.0.0.1\",resource=\"qps\"}"), 2);
    EXPECT_EQ(SampleValue(text, "freeflow_router_pod_held{address=\"10.0.0.1\",resource=\"sessions\"}"),
              1);
    EXPECT_EQ(
        SampleValue(text, "freeflow_router_pod_held_bytes{address=\"10.0.0.1\",resource=\"mapped\"}"), 0);
    EXPECT_EQ(SampleValue(text,
                    "freeflow_router_pod_quota_refusals_total{address=\"10.0.0.1\","
                    "quota=\"qps\"}"),
              1);
    EXPECT_EQ(SampleValue(text, "freeflow_router_quota_refusals_total{quota=\"qps\"}"), 1);
    EXPECT_TRUE(std::regex_search(
        text,
        std::regex(
            "\nfreeflow_router_request_errors_total\\{op=\"[0-9]+\",errno=\"ENOSPC\"\\} 1\n")))
        << text;
    std::string report;
    EXPECT_EQ(ff::test::PromtoolCheck(text, &report), 0) << report << text;
  }
  // The pod's last session ended: its series go, the node's count of refusals stays.
  ASSERT_TRUE(WaitForValue(router, "freeflow_router_sessions", 0));
  text = Scrape(router);
  EXPECT_EQ(text.find("address=\"10.0.0.1\""), std::string::npos) << text;
  EXPECT_EQ(SampleValue(text, "freeflow_router_qps"), 0);
  EXPECT_EQ(SampleValue(text, "freeflow_router_quota_refusals_total{quota=\"qps\"}"), 1);
}

// QPs by the state the router sees: an RC QP is unconnected until its owner names a peer,
// a UD QP is a datagram QP from its create on.
TEST(RouterMetricsTest, QpsAreCountedByTheStateTheRouterSees) {
  TestRouter router(Scraped());
  RawPod a(router, Ip("10.0.0.1")), b(router, Ip("10.0.0.2"));
  ASSERT_EQ(a.Hello(), 0);
  ASSERT_EQ(b.Hello(), 0);
  const RawQp qa = a.CreateQp(IBV_QPT_RC), qb = b.CreateQp(IBV_QPT_RC);
  ASSERT_EQ(qa.status, 0);
  ASSERT_EQ(qb.status, 0);
  ASSERT_EQ(a.CreateQp(IBV_QPT_UD).status, 0);
  std::string text = Scrape(router);
  EXPECT_EQ(SampleValue(text, "freeflow_router_qps_by_state{state=\"unconnected\"}"), 2) << text;
  EXPECT_EQ(SampleValue(text, "freeflow_router_qps_by_state{state=\"connected\"}"), 0);
  EXPECT_EQ(SampleValue(text, "freeflow_router_qps_by_state{state=\"datagram\"}"), 1);
  a.Connect(qa, Ip("10.0.0.2"), qb.qpn);
  text = Scrape(router);
  EXPECT_EQ(SampleValue(text, "freeflow_router_qps_by_state{state=\"unconnected\"}"), 1) << text;
  EXPECT_EQ(SampleValue(text, "freeflow_router_qps_by_state{state=\"connected\"}"), 1);
  b.Connect(qb, Ip("10.0.0.1"), qa.qpn);
  text = Scrape(router);
  EXPECT_EQ(SampleValue(text, "freeflow_router_qps_by_state{state=\"unconnected\"}"), 0) << text;
  EXPECT_EQ(SampleValue(text, "freeflow_router_qps_by_state{state=\"connected\"}"), 2);
  std::string report;
  EXPECT_EQ(ff::test::PromtoolCheck(text, &report), 0) << report << text;
}

// Requests of other routers that the router refuses are counted by reason: a connect in the
// name of a pod the control plane places on another node than the link's. The families of
// the router port's and the direct listeners' refusals have a series for every reason.
TEST(RouterMetricsTest, RefusalsOfOtherRoutersAreCountedByReason) {
  LoopbackNetwork net;
  FakeCluster cluster;
  TestRouter a{{"node-a", Ip("192.168.0.1"), &net, &cluster}};
  TestRouter::Options ob{"node-b", Ip("192.168.0.2"), &net, &cluster};
  ob.metrics_address = "127.0.0.1:0";
  TestRouter b(ob);
  RawPod initiator(a, Ip("10.1.0.1")), target(b, Ip("10.2.0.1"));
  ASSERT_EQ(initiator.Hello(), 0);
  ASSERT_EQ(target.Hello(), 0);
  const std::string series =
      "freeflow_router_peer_refused_total{request=\"connect\",reason=\"pod_of_another_node\"}";
  std::string text = Scrape(b);
  EXPECT_EQ(SampleValue(text, series), 0) << text;
  for (const char* why : {"address", "crowded", "closed", "unauthentic"}) {
    EXPECT_EQ(
        SampleValue(text, std::string("freeflow_router_direct_refused_total{reason=\"") + why + "\"}"), 0)
        << why;
  }
  EXPECT_NE(text.find("# TYPE freeflow_router_node_port_refused_total counter"), std::string::npos);
  RawQp forged = initiator.CreateQp(IBV_QPT_RC);
  RawQp victim = target.CreateQp(IBV_QPT_RC);
  ASSERT_EQ(target.Name(victim, Ip("10.1.0.1"), forged.qpn), EINPROGRESS);
  cluster.Set(Ip("10.1.0.1"), {"node-c", Ip("192.168.0.3"), 7471});  // says another node
  EXPECT_EQ(initiator.Connect(forged, Ip("10.2.0.1"), victim.qpn).status, EACCES);
  ASSERT_TRUE(WaitForValue(b, series, 1));
  text = Scrape(b);
  EXPECT_EQ(
      SampleValue(text, "freeflow_router_peer_refused_total{request=\"connect\",reason=\"unknown_pod\"}"),
      0);
  std::string report;
  EXPECT_EQ(ff::test::PromtoolCheck(text, &report), 0) << report << text;
}

// A pod that breaks the protocol ends its session; the reason is counted, and noted for
// ffctl events.
TEST(RouterMetricsTest, SessionEndsAreCountedByReason) {
  TestRouter router(Scraped());
  {
    RawPod pod(router, Ip("10.0.0.3"));
    ASSERT_EQ(pod.Hello(), 0);
    const char junk[5] = {1, 2, 3, 4, 5};
    pod.SendRaw(junk, sizeof(junk));
    ASSERT_TRUE(pod.Disconnected());
  }
  {
    RawPod pod(router, Ip("10.0.0.4"));
    ASSERT_EQ(pod.Hello(), 0);
  }
  ASSERT_TRUE(WaitForValue(
      router, "freeflow_router_session_ends_total{reason=\"client closed the connection\"}", 1));
  const std::string text = Scrape(router);
  EXPECT_EQ(
      SampleValue(text, "freeflow_router_session_ends_total{reason=\"malformed or unexpected message\"}"),
      1)
      << text;
}

TEST(RouterMetricsTest, TheLoopsWorkIsCounted) {
  TestRouter router(Scraped());
  const double busy = SampleValue(Scrape(router), "freeflow_router_loop_busy_seconds_total");
  const double turns = SampleValue(Scrape(router), "freeflow_router_loop_turn_seconds_count");
  ASSERT_GE(busy, 0);
  ASSERT_GE(turns, 0);
  for (int i = 0; i < 20; ++i) {
    RawPod pod(router, Ip("10.0.0.2"));
    ASSERT_EQ(pod.Hello(), 0);
    ASSERT_EQ(pod.CreateQp(IBV_QPT_RC).status, 0);
  }
  const std::string text = Scrape(router);
  EXPECT_GT(SampleValue(text, "freeflow_router_loop_busy_seconds_total"), busy) << text;
  EXPECT_GT(SampleValue(text, "freeflow_router_loop_turn_seconds_count"), turns + 20);
  EXPECT_EQ(SampleValue(text, "freeflow_router_loop_turn_seconds_count"),
            SampleValue(text, "freeflow_router_loop_turn_seconds_bucket{le=\"+Inf\"}"));
  EXPECT_GT(SampleValue(text, "process_open_fds"), 0);
  EXPECT_GT(SampleValue(text, "process_resident_memory_bytes"), 0);
  EXPECT_TRUE(std::regex_search(
      text,
      std::regex("\nfreeflow_router_build_info\\{version=\"[0-9.]+\",commit=\"[^\"]+\"\\} 1\n")))
      << text;
}

// A loop that does not answer (here: held by a test; in life, a stall) gets the scrape a 503
// within MetricsService::kRenderWaitMs, and the next scrape after it is answered.
TEST(RouterMetricsTest, AStalledLoopAnswersServiceUnavailable) {
  TestRouter router(Scraped());
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  router.Post([released] { released.wait_for(std::chrono::seconds(10)); });
  const auto start = std::chrono::steady_clock::now();
  const auto answer = ff::test::HttpRequest(router.MetricsPort(), "GET", "/metrics");
  const auto waited = std::chrono::steady_clock::now() - start;
  release.set_value();
  EXPECT_EQ(answer.status, 503);
  EXPECT_LT(waited, std::chrono::milliseconds(MetricsService::kRenderWaitMs + 1000));
  EXPECT_EQ(ff::test::HttpRequest(router.MetricsPort(), "GET", "/metrics").status, 200);
}

TEST(RouterMetricsTest, NotServedUnlessAsked) {
  TestRouter router(TestRouter::Options{});
  EXPECT_EQ(router.MetricsPort(), 0);
}

}  // namespace
}  // namespace ff::router::test
