// What the tests of work requests left waiting in the library share (waiting_sends_test,
// idle_sender_test): how many of a pod's WQEs the library has not executed, and a marker
// WRITE from a into b's buffer, behind everything posted before, whose arrival is checked by
// reading b's memory only (as riostream waits), so that neither pod calls the library.
#pragma once

#include <gtest/gtest.h>
#include <infiniband/verbs.h>

#include <chrono>
#include <mutex>
#include <thread>

#include "base/objects.h"
#include "pods.h"

namespace ff::cluster_test {

class MarkerTest : public ClusterTest {
 protected:
  static constexpr size_t kMarkerOffset = kBufferBytes - 64;

  static uint64_t Unexecuted(const Pod& pod) {
    ff::verbs::Qp* q = ff::verbs::ToQp(pod.qp);
    std::lock_guard<ff::verbs::AdaptiveLock> l(q->ctx->lock);
    return q->sq.tail - q->sq.exec;
  }
  void PostMarker(uint64_t wr_id, char marker) {
    a->buf[kMarkerOffset] = marker;
    ASSERT_EQ(a->Post(IBV_WR_RDMA_WRITE, wr_id, kMarkerOffset, 1, b.get(), kMarkerOffset), 0);
  }
  // Waits (at most 5 s) until b's memory at `offset` holds `want`, reading memory only.
  bool Arrives(size_t offset, char want) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    const volatile char* p = b->buf + offset;
    while (*p != want) {
      if (std::chrono::steady_clock::now() > end) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
  }
};

}  // namespace ff::cluster_test
