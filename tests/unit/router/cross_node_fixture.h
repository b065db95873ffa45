// The fixture of the cross-node router tests: two routers joined by the in-memory node
// transport, an initiator pod whose RC QP reaches a target pod's RC QP through a proxy, both
// speaking the protocol themselves (raw pods).
#pragma once

#include <gtest/gtest.h>
#include <infiniband/verbs.h>

#include <cerrno>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "harness.h"

namespace ff::router::test {

constexpr uint32_t kAll = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                          IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
constexpr uint64_t kAddr = 0x100000;

class CrossNodeTest : public ::testing::Test {
 protected:
  explicit CrossNodeTest(size_t high_water = kLinkHighWater) : net(high_water) {}

  void SetUp() override {
    ASSERT_EQ(initiator.Hello(), 0);
    ASSERT_EQ(target.Hello(), 0);
    qa = initiator.CreateQp(IBV_QPT_RC);
    qb = target.CreateQp(IBV_QPT_RC);
    qb.hdr()->qp_access.store(kAll);
    inbound.Attach(qb.ring(0), qb.ring_bytes);
    ASSERT_EQ(target.Name(qb, Ip("10.1.0.1"), qa.qpn), EINPROGRESS);
    link = initiator.Connect(qa, Ip("10.2.0.1"), qb.qpn);
    ASSERT_EQ(link.status, 0);
    ASSERT_TRUE(link.reply.flags & proto::kConnectRemote);
    ASSERT_EQ(link.fds.size(), 2u);
    EXPECT_EQ(link.reply.peer_qpn, qb.qpn);
  }

  // Writes one request into the proxy and rings the doorbell when the router armed it, as
  // the library does; the ring must have room at once.
  void Post(uint8_t kind, uint8_t flags, const ProxyRequest& req, const void* data = nullptr,
            uint32_t len = 0) {
    ASSERT_EQ(PostRequest(link, kind, flags, req, data, len, std::chrono::milliseconds(0)),
              RingStatus::kOk);
  }
  void Send(uint32_t seq, const std::string& text, uint8_t rnr_retry = 7) {
    ASSERT_EQ(PostSend(link, seq, text, rnr_retry, std::chrono::milliseconds(0)), RingStatus::kOk);
  }
  // The next answer of the router, its data in *data.
  ProxyResponse Answer(std::vector<char>* data = nullptr, int timeout_ms = 3000) {
    const std::optional<ProxyResponse> r =
        NextAnswer(link, data, std::chrono::milliseconds(timeout_ms));
    if (r) return *r;
    ADD_FAILURE() << "no answer";
    return ProxyResponse{0, ~0u, 0xffff, 0, 0};
  }
  bool NoAnswer(int ms) {
    RecordHeader h;
    const char* p;
    return !WaitFor([&] { return link.responses.Peek(&h, &p) == RingStatus::kOk; },
                    std::chrono::milliseconds(ms));
  }

  LoopbackNetwork net;
  FakeCluster cluster;
  TestRouter a{{"node-a", Ip("192.168.0.1"), &net, &cluster}};
  TestRouter b{{"node-b", Ip("192.168.0.2"), &net, &cluster}};
  RawPod initiator{a, Ip("10.1.0.1")};
  RawPod target{b, Ip("10.2.0.1")};
  RawQp qa, qb;
  RawLink link;
  RingConsumer inbound;  // qb's ring, as the target process reads it
};

}  // namespace ff::router::test
