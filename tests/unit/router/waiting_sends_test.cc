// The router's side of work requests that wait in the library (QpSegmentHeader::
// sends_waiting): once it has made room for them and the library did not come back for it,
// the pod's session hears kProxyDrained for the QP, once, and the word says so. Pods speak
// the protocol themselves (raw pods), across two routers.
#include <gtest/gtest.h>
#include <infiniband/verbs.h>

#include <atomic>

#include "cross_node_fixture.h"

namespace ff::router::test {
namespace {

class WaitingSendsTest : public CrossNodeTest {
 protected:
  void SetUp() override {
    CrossNodeTest::SetUp();
    rkey = target.Register(1, 1 << 16, kAll, kAddr, &memory);
    ASSERT_NE(rkey, 0u);
  }
  std::atomic<uint32_t>& Word() { return link.seg.as<QpSegmentHeader>()->sends_waiting; }
  // One WRITE of 8 bytes as work request `seq`, then its answer.
  void WriteAndWait(uint32_t seq) {
    ProxyRequest w{};
    w.opcode = IBV_WR_RDMA_WRITE;
    w.rkey = rkey;
    w.seq = seq;
    w.length = 8;
    w.remote_addr = kAddr;
    w.last = 1;
    Post(kRecWrite, 0, w, "payload!", 8);
    EXPECT_EQ(Answer().status, IBV_WC_SUCCESS);
  }

  Mapping memory;
  uint32_t rkey = 0;
};

// The library published a request, found no room for the next (its word set) and stopped:
// the router drains the ring and, the library publishing nothing more, tells it.
TEST_F(WaitingSendsTest, ALibraryThatStoppedWithSendsWaitingIsToldOnce) {
  Word().store(kSendsWaiting);
  WriteAndWait(1);
  const std::optional<proto::Event> e = initiator.NextEvent();
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->type, proto::EventType::kProxyDrained);
  EXPECT_EQ(e->qpn, qa.qpn);
  EXPECT_EQ(Word().load(), kSendsNudged);
  // Until the library takes the nudge (the word back to 0), room made tells it nothing more.
  WriteAndWait(2);
  EXPECT_FALSE(initiator.NextEvent(300).has_value());
  Word().store(kSendsWaiting);  // it took the nudge, and a request blocks again
  WriteAndWait(3);
  const std::optional<proto::Event> again = initiator.NextEvent();
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->type, proto::EventType::kProxyDrained);
}

// Nothing waits in the library: the router drains and answers, and sends no event.
TEST_F(WaitingSendsTest, NoEventWhenNothingWaits) {
  WriteAndWait(1);
  WriteAndWait(2);
  EXPECT_FALSE(initiator.NextEvent(300).has_value());
  EXPECT_EQ(Word().load(), 0u);
}

// A pod's own word is all it can set: any other value is left alone and asks for nothing.
TEST_F(WaitingSendsTest, AWordTheRouterDidNotExpectIsLeftAlone) {
  Word().store(0xdead);
  WriteAndWait(1);
  EXPECT_FALSE(initiator.NextEvent(300).has_value());
  EXPECT_EQ(Word().load(), 0xdeadu);
}

}  // namespace
}  // namespace ff::router::test
