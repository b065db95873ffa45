// QP numbers granted for posted creates (proto::CreateQp, proto::CreateQpReply): what the
// library relies on to create an RC/UC QP without waiting, and what a pod cannot do with
// them.
#include <gtest/gtest.h>
#include <infiniband/verbs.h>

#include <algorithm>

#include "harness.h"

namespace ff::router::test {
namespace {

size_t Count(const std::vector<uint32_t>& v, uint32_t n) {
  return static_cast<size_t>(std::count(v.begin(), v.end(), n));
}

int Destroy(RawPod& pod, uint32_t qpn) {
  proto::DestroyQp d{};
  d.id = qpn;
  return pod.Call(d).status;
}

class QpnGrantTest : public ::testing::Test {
 protected:
  TestRouter router{TestRouter::Options{}};
};

// An answered RC create grants kQpnGrant numbers no QP has. A create posted under one makes
// a QP like any other: a peer names it, it links and passes a message, it is destroyed. The
// next answer lists the numbers left, topped up, never the one used.
TEST_F(QpnGrantTest, APostedCreateUnderAGrantedNumberMakesAWorkingQp) {
  RawPod a(router, Ip("10.0.0.1")), b(router, Ip("10.0.0.2"));
  ASSERT_EQ(a.Hello(), 0);
  ASSERT_EQ(b.Hello(), 0);
  const RawQp first = a.CreateQp(IBV_QPT_RC);
  ASSERT_EQ(first.status, 0);
  ASSERT_EQ(first.grants.size(), proto::kQpnGrant);
  EXPECT_EQ(Count(first.grants, first.qpn), 0u);
  const uint32_t n = first.grants.back();
  const RawQp qa = a.CreateGrantedQp(n, true);
  const RawQp qb = b.CreateQp(IBV_QPT_RC);
  ASSERT_EQ(qb.status, 0);
  EXPECT_NE(qb.qpn, n);
  EXPECT_EQ(Count(qb.grants, n), 0u) << "two sessions were granted one number";
  ASSERT_EQ(b.Name(qb, Ip("10.0.0.1"), n), EINPROGRESS);
  RawLink link = a.Connect(qa, Ip("10.0.0.2"), qb.qpn);
  ASSERT_EQ(link.status, 0);
  EXPECT_EQ(PassMessage(link, qb, "granted"), "granted");
  const RawQp next = a.CreateQp(IBV_QPT_RC);
  ASSERT_EQ(next.status, 0);
  EXPECT_EQ(next.grants.size(), proto::kQpnGrant);
  EXPECT_EQ(Count(next.grants, n), 0u) << "a used number was granted again";
  EXPECT_EQ(Count(next.grants, next.qpn), 0u);
  for (uint32_t g : first.grants) {
    if (g == n) continue;
    EXPECT_EQ(Count(next.grants, g), 1u) << "an unused number was dropped";
  }
  EXPECT_EQ(Destroy(a, n), 0);
}

// A number serves the session it was granted to, once, for an RC/UC QP; a posted create must
// name one. Refusals leave the owner's numbers as they were.
TEST_F(QpnGrantTest, ANumberServesItsSessionOnceAndOnlyForAnRcOrUcQp) {
  RawPod a(router, Ip("10.0.0.1")), sibling(router, Ip("10.0.0.1")), other(router, Ip("10.0.0.2"));
  ASSERT_EQ(a.Hello(), 0);
  ASSERT_EQ(sibling.Hello(), 0);
  ASSERT_EQ(other.Hello(), 0);
  const RawQp first = a.CreateQp(IBV_QPT_RC);
  ASSERT_EQ(first.grants.size(), proto::kQpnGrant);
  const std::vector<uint32_t>& g = first.grants;
  // Another pod, or another process of the same pod, cannot use them, answered or posted.
  EXPECT_EQ(other.CreateGrantedQp(g[0], false).status, ENOENT);
  EXPECT_EQ(sibling.CreateGrantedQp(g[0], false).status, ENOENT);
  other.CreateGrantedQp(g[1], true);
  ASSERT_TRUE(other.Flush());
  EXPECT_EQ(Destroy(other, g[1]), ENOENT) << "the posted create of another's number made a QP";
  // Not for UD (its senders' rings are counted otherwise); the number is used up all the same.
  EXPECT_EQ(a.CreateGrantedQp(g[2], false, IBV_QPT_UD).status, EINVAL);
  EXPECT_EQ(a.CreateGrantedQp(g[2], false).status, ENOENT);
  // Once.
  EXPECT_EQ(a.CreateGrantedQp(g[0], false).status, 0);
  EXPECT_EQ(a.CreateGrantedQp(g[0], false).status, ENOENT);
  EXPECT_EQ(a.CreateGrantedQp(g[1], false).status, 0) << "another's attempt took the number";
  // Posted without a number: nobody would learn it, so no QP; the pod is still served.
  a.CreateGrantedQp(0, true);
  const RawQp after = a.CreateQp(IBV_QPT_RC);
  EXPECT_EQ(after.status, 0);
  EXPECT_EQ(Count(after.grants, g[0]) + Count(after.grants, g[1]) + Count(after.grants, g[2]), 0u);
}

TestRouter::Options Limited(PodLimits limits) {
  TestRouter::Options o;
  o.limits = limits;
  return o;
}

// Granted numbers hold none of the pod's quota: another process of the pod may use all of
// it. A posted create that the quota then refuses is logged, and its process hears kQpRefused
// for the number, so that the QP it believes it has fails instead of waiting.
TEST(QpnGrantQuotaTest, GrantsHoldNoQuotaAndARefusedPostedCreateFailsItsQp) {
  constexpr uint32_t kLimit = 2 * proto::kQpnGrant + 2;
  TestRouter router(Limited(WithLimits({{Quota::kQps, kLimit}})));
  RawPod a(router, Ip("10.0.0.1")), b(router, Ip("10.0.0.1"));
  ASSERT_EQ(a.Hello(), 0);
  ASSERT_EQ(b.Hello(), 0);
  const RawQp first = a.CreateQp(IBV_QPT_RC);
  ASSERT_EQ(first.grants.size(), proto::kQpnGrant);
  for (uint32_t i = 1; i < kLimit; ++i) ASSERT_EQ(b.CreateQp(IBV_QPT_RC).status, 0) << i;
  EXPECT_EQ(b.CreateQp(IBV_QPT_RC).status, ENOSPC);
  const uint32_t n = first.grants[0];
  a.CreateGrantedQp(n, true);
  const std::optional<proto::Event> e = a.NextEvent();
  ASSERT_TRUE(e.has_value()) << "the refused posted create was not reported";
  EXPECT_EQ(e->type, proto::EventType::kQpRefused);
  EXPECT_EQ(e->qpn, n);
  EXPECT_EQ(Destroy(a, n), ENOENT);
}

// A pod within 2 x kQpnGrant of its QP or descriptor quota is granted nothing: it creates
// every QP answered, and each refusal reaches the call that caused it.
TEST(QpnGrantQuotaTest, APodNearItsLimitsIsGrantedNothing) {
  TestRouter few_qps(Limited(WithLimits({{Quota::kQps, 2 * proto::kQpnGrant}})));
  RawPod a(few_qps, Ip("10.0.0.1"));
  ASSERT_EQ(a.Hello(), 0);
  const RawQp qa = a.CreateQp(IBV_QPT_RC);
  ASSERT_EQ(qa.status, 0);
  EXPECT_TRUE(qa.grants.empty());
  // The session's socket and HELLO's five descriptors, then the QP's segment.
  TestRouter few_fds(Limited(WithLimits({{Quota::kFds, 6 + 2 * proto::kQpnGrant}})));
  RawPod b(few_fds, Ip("10.0.0.1"));
  ASSERT_EQ(b.Hello(), 0);
  const RawQp qb = b.CreateQp(IBV_QPT_RC);
  ASSERT_EQ(qb.status, 0);
  EXPECT_TRUE(qb.grants.empty());
}

}  // namespace
}  // namespace ff::router::test
