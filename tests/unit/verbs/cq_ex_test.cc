// Extended CQs (ibv_create_cq_ex and the ibv_start_poll family) and ibv_resize_cq, on two
// QPs of one pod linked to each other on this node.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "datapath/completion.h"
#include "pod.h"

namespace fftest {
namespace {

constexpr uint64_t kAllFlags = ff::verbs::kCqExWcFlags;

ibv_cq_ex* NewCqEx(ibv_context* ctx, uint64_t wc_flags, int cqe = 64,
                   ibv_comp_channel* channel = nullptr, uint32_t comp_mask = 0,
                   uint32_t flags = 0) {
  ibv_cq_init_attr_ex a{};
  a.cqe = static_cast<uint32_t>(cqe);
  a.channel = channel;
  a.wc_flags = wc_flags;
  a.comp_mask = comp_mask;
  a.flags = flags;
  errno = 0;
  return ibv_create_cq_ex(ctx, &a);
}

// Two linked QPs whose completions all go to `cq`.
struct Loopback {
  Loopback(Pod& pod, ibv_cq* cq) {
    QpOptions o;
    o.send_cq = o.recv_cq = cq;
    a = pod.CreateQp(o);
    b = pod.CreateQp(o);
    pod.router.AnswerLoopback(a->qp_num, b->qp_num);
    pod.router.AnswerLoopback(b->qp_num, a->qp_num);
    EXPECT_EQ(pod.Connect(a, b->qp_num, o), 0);
    EXPECT_EQ(pod.Connect(b, a->qp_num, o), 0);
  }
  ibv_qp* a = nullptr;
  ibv_qp* b = nullptr;
};

// One completion as the ibv_wc_read_* functions of a CQ with every field report it.
struct Seen {
  uint64_t wr_id;
  ibv_wc_status status;
  ibv_wc_opcode opcode;
  uint32_t byte_len, qp_num, src_qp, slid, vendor_err;
  __be32 imm;
  unsigned int flags;
  uint8_t sl, path_bits;
};

Seen Read(ibv_cq_ex* cq) {
  return Seen{cq->wr_id,
              cq->status,
              ibv_wc_read_opcode(cq),
              ibv_wc_read_byte_len(cq),
              ibv_wc_read_qp_num(cq),
              ibv_wc_read_src_qp(cq),
              ibv_wc_read_slid(cq),
              ibv_wc_read_vendor_err(cq),
              ibv_wc_read_imm_data(cq),
              ibv_wc_read_wc_flags(cq),
              ibv_wc_read_sl(cq),
              ibv_wc_read_dlid_path_bits(cq)};
}

// Polls batches (start_poll, next_poll until ENOENT, end_poll) until `n` completions came or
// kWaitLimit passed.
std::vector<Seen> PollEx(ibv_cq_ex* cq, size_t n) {
  std::vector<Seen> out;
  ibv_poll_cq_attr attr{};
  const auto end = Clock::now() + kWaitLimit;
  while (out.size() < n && Clock::now() < end) {
    const int rc = ibv_start_poll(cq, &attr);
    if (rc != 0) {
      EXPECT_EQ(rc, ENOENT);
      continue;
    }
    int next = 0;
    do {
      out.push_back(Read(cq));
    } while ((next = ibv_next_poll(cq)) == 0);
    EXPECT_EQ(next, ENOENT);
    ibv_end_poll(cq);
  }
  return out;
}

TEST(CqEx, EveryAdvertisedFieldReadsWhatPollCqWouldReport) {
  Pod pod;
  ibv_cq_ex* cqx = NewCqEx(pod.ctx, kAllFlags);
  ASSERT_NE(cqx, nullptr) << std::strerror(errno);
  Loopback l(pod, ibv_cq_ex_to_cq(cqx));
  Buffer src(pod.pd, 4096);
  Buffer dst(pod.pd, 4096);
  ASSERT_EQ(PostRecv(l.b, dst.Sge(0, 1000), 7), 0);
  ASSERT_EQ(PostSend(l.a, IBV_WR_SEND_WITH_IMM, src.Sge(0, 300), 1), 0);
  const std::vector<Seen> seen = PollEx(cqx, 2);
  ASSERT_EQ(seen.size(), 2u);
  const Seen& recv = seen[0].opcode == IBV_WC_RECV ? seen[0] : seen[1];
  const Seen& send = seen[0].opcode == IBV_WC_RECV ? seen[1] : seen[0];
  EXPECT_EQ(recv.opcode, IBV_WC_RECV);
  EXPECT_EQ(recv.status, IBV_WC_SUCCESS);
  EXPECT_EQ(recv.wr_id, 7u);
  EXPECT_EQ(recv.byte_len, 300u);
  EXPECT_EQ(recv.imm, htonl(0xabcd));
  EXPECT_TRUE(recv.flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(recv.qp_num, l.b->qp_num);
  EXPECT_EQ(recv.src_qp, l.a->qp_num);
  EXPECT_EQ(recv.sl, 0);
  EXPECT_EQ(recv.path_bits, 0);
  EXPECT_EQ(recv.vendor_err, 0u);
  EXPECT_EQ(send.opcode, IBV_WC_SEND);
  EXPECT_EQ(send.status, IBV_WC_SUCCESS);
  EXPECT_EQ(send.wr_id, 1u);
  EXPECT_EQ(send.qp_num, l.a->qp_num);
  ibv_poll_cq_attr attr{};
  EXPECT_EQ(ibv_start_poll(cqx, &attr), ENOENT);  // no end_poll after ENOENT
}

TEST(CqEx, CompletionsComeInOrderAndPostingInsideABatchWorks) {
  Pod pod;
  ibv_cq_ex* cqx = NewCqEx(pod.ctx, IBV_WC_EX_WITH_BYTE_LEN, 64, nullptr,
                           IBV_CQ_INIT_ATTR_MASK_FLAGS, IBV_CREATE_CQ_ATTR_SINGLE_THREADED);
  ASSERT_NE(cqx, nullptr) << std::strerror(errno);
  ibv_cq* rcq = pod.NewCq();
  QpOptions o;
  o.send_cq = ibv_cq_ex_to_cq(cqx);
  o.recv_cq = rcq;
  ibv_qp* a = pod.CreateQp(o);
  ibv_qp* b = pod.CreateQp(o);
  pod.router.AnswerLoopback(a->qp_num, b->qp_num);
  pod.router.AnswerLoopback(b->qp_num, a->qp_num);
  ASSERT_EQ(pod.Connect(a, b->qp_num, o), 0);
  ASSERT_EQ(pod.Connect(b, a->qp_num, o), 0);
  Buffer src(pod.pd, 4096);
  Buffer dst(pod.pd, 4096);
  for (uint64_t i = 0; i < 8; ++i) ASSERT_EQ(PostRecv(b, dst.Sge(0, 100), 100 + i), 0);
  for (uint64_t i = 0; i < 4; ++i) ASSERT_EQ(PostSend(a, IBV_WR_SEND, src.Sge(0, 10), i), 0);
  ibv_poll_cq_attr attr{};
  const auto end = Clock::now() + kWaitLimit;
  int rc;
  while ((rc = ibv_start_poll(cqx, &attr)) == ENOENT && Clock::now() < end) {
  }
  ASSERT_EQ(rc, 0);
  // A program may post more work between start_poll and end_poll.
  for (uint64_t i = 4; i < 8; ++i) ASSERT_EQ(PostSend(a, IBV_WR_SEND, src.Sge(0, 10), i), 0);
  std::vector<uint64_t> ids{cqx->wr_id};
  while (ids.size() < 8 && Clock::now() < end) {
    rc = ibv_next_poll(cqx);
    if (rc == 0)
      ids.push_back(cqx->wr_id);
    else
      ASSERT_EQ(rc, ENOENT);
  }
  ibv_end_poll(cqx);
  EXPECT_EQ(ids, (std::vector<uint64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(PollN(rcq, 8).size(), 8u);
}

TEST(CqEx, IsAnOrdinaryCqForPollCqEventsAndDestroy) {
  Pod pod;
  ibv_comp_channel* ch = pod.NewChannel();
  ibv_cq_ex* cqx = NewCqEx(pod.ctx, IBV_WC_EX_WITH_QP_NUM, 16, ch);
  ASSERT_NE(cqx, nullptr) << std::strerror(errno);
  ibv_cq* cq = ibv_cq_ex_to_cq(cqx);
  EXPECT_EQ(cq->channel, ch);
  EXPECT_GE(cq->cqe, 16);
  Loopback l(pod, cq);
  Buffer src(pod.pd, 4096);
  ASSERT_EQ(ibv_req_notify_cq(cq, 0), 0);
  ASSERT_EQ(PostSend(l.a, IBV_WR_RDMA_WRITE, src.Sge(0, 64), 9,
                     reinterpret_cast<uintptr_t>(src.data()) + 1024, src.mr()->rkey),
            0);
  pollfd p{ch->fd, POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 5000), 1);
  ibv_cq* ev = nullptr;
  void* ev_ctx = nullptr;
  ASSERT_EQ(ibv_get_cq_event(ch, &ev, &ev_ctx), 0);
  EXPECT_EQ(ev, cq);
  ibv_ack_cq_events(ev, 1);
  const std::vector<ibv_wc> wcs = PollN(cq, 1);  // plain ibv_poll_cq on the same CQ
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].wr_id, 9u);
  EXPECT_EQ(wcs[0].opcode, IBV_WC_RDMA_WRITE);
  EXPECT_EQ(ibv_destroy_cq(cq), EBUSY);  // QPs still use it; the pod's close releases it
}

TEST(CqEx, OnlyTheRequestedFieldsHaveReaders) {
  Pod pod;
  ibv_cq_ex* cqx = NewCqEx(pod.ctx, IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_SRC_QP);
  ASSERT_NE(cqx, nullptr);
  EXPECT_NE(cqx->start_poll, nullptr);
  EXPECT_NE(cqx->read_opcode, nullptr);
  EXPECT_NE(cqx->read_wc_flags, nullptr);
  EXPECT_NE(cqx->read_byte_len, nullptr);
  EXPECT_NE(cqx->read_src_qp, nullptr);
  EXPECT_EQ(cqx->read_imm_data, nullptr);
  EXPECT_EQ(cqx->read_qp_num, nullptr);
  EXPECT_EQ(cqx->read_completion_ts, nullptr);
  EXPECT_EQ(cqx->read_completion_wallclock_ns, nullptr);
  EXPECT_EQ(ibv_destroy_cq(ibv_cq_ex_to_cq(cqx)), 0);
}

TEST(CqEx, RefusesWhatTheDeviceCannotDo) {
  Pod pod;
  struct Case {
    const char* what;
    uint64_t wc_flags;
    int cqe;
    uint32_t comp_mask, flags;
    int err;
  } cases[] = {
      {"completion timestamps", IBV_WC_EX_WITH_COMPLETION_TIMESTAMP, 16, 0, 0, EOPNOTSUPP},
      {"wallclock timestamps", IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK, 16, 0, 0, EOPNOTSUPP},
      {"cvlan", IBV_WC_EX_WITH_CVLAN, 16, 0, 0, EOPNOTSUPP},
      {"flow tag", IBV_WC_EX_WITH_FLOW_TAG, 16, 0, 0, EOPNOTSUPP},
      {"tag matching", IBV_WC_EX_WITH_TM_INFO, 16, 0, 0, EOPNOTSUPP},
      {"zero cqe", 0, 0, 0, 0, EINVAL},
      {"too many cqe", 0, static_cast<int>(ff::kMaxCqe) + 1, 0, 0, EINVAL},
      {"parent domain", 0, 16, IBV_CQ_INIT_ATTR_MASK_PD, 0, EINVAL},
      {"unknown creation flag", 0, 16, IBV_CQ_INIT_ATTR_MASK_FLAGS, 1u << 5, EINVAL},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(NewCqEx(pod.ctx, c.wc_flags, c.cqe, nullptr, c.comp_mask, c.flags), nullptr)
        << c.what;
    EXPECT_EQ(errno, c.err) << c.what;
  }
  ibv_cq_init_attr_ex a{};
  a.cqe = 16;
  a.comp_vector = 1;  // the device has one
  EXPECT_EQ(ibv_create_cq_ex(pod.ctx, &a), nullptr);
  EXPECT_EQ(errno, EINVAL);
  // The device reports no timestamps, consistently with the refusal above.
  ibv_device_attr_ex attr{};
  ASSERT_EQ(ibv_query_device_ex(pod.ctx, nullptr, &attr), 0);
  EXPECT_EQ(attr.completion_timestamp_mask, 0u);
  EXPECT_EQ(attr.hca_core_clock, 0u);
}

// The asynchronous events the device reported so far (without waiting).
std::vector<ibv_event_type> AsyncEvents(ibv_context* ctx) {
  std::vector<ibv_event_type> out;
  const int flags = ::fcntl(ctx->async_fd, F_GETFL);
  if (flags < 0 || ::fcntl(ctx->async_fd, F_SETFL, flags | O_NONBLOCK) != 0) return out;
  ibv_async_event e{};
  for (int i = 0; i < 100 && ibv_get_async_event(ctx, &e) == 0; ++i) {
    out.push_back(e.event_type);
    ibv_ack_async_event(&e);
  }
  return out;
}

// What a portable program passes (rxe and mlx5 take it): the standard work-completion fields
// and both creation flags. IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN then keeps an overflow from
// being reported; without it the overflow is an IBV_EVENT_CQ_ERR.
TEST(CqEx, TakesTheStandardFieldsAndBothCreationFlags) {
  for (const bool ignore : {true, false}) {
    Pod pod;
    const uint32_t flags =
        IBV_CREATE_CQ_ATTR_SINGLE_THREADED | (ignore ? IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN : 0);
    ibv_cq_ex* cqx =
        NewCqEx(pod.ctx, IBV_WC_STANDARD_FLAGS, 1, nullptr, IBV_CQ_INIT_ATTR_MASK_FLAGS, flags);
    ASSERT_NE(cqx, nullptr) << std::strerror(errno);
    Loopback l(pod, ibv_cq_ex_to_cq(cqx));
    Buffer src(pod.pd, 4096);
    for (uint64_t i = 0; i < 4; ++i)  // same-node writes complete at once: one more than fits
      ASSERT_EQ(PostSend(l.a, IBV_WR_RDMA_WRITE, src.Sge(0, 8), i,
                         reinterpret_cast<uintptr_t>(src.data()) + 2048, src.mr()->rkey),
                0);
    ibv_poll_cq_attr attr{};
    if (ibv_start_poll(cqx, &attr) == 0) ibv_end_poll(cqx);
    const std::vector<ibv_event_type> events = AsyncEvents(pod.ctx);
    const bool reported = std::find(events.begin(), events.end(), IBV_EVENT_CQ_ERR) != events.end();
    EXPECT_EQ(reported, !ignore) << (ignore ? "reported though asked not to" : "not reported");
  }
}

TEST(ResizeCq, GrowsAndShrinksKeepingCompletionsInOrder) {
  Pod pod;
  ibv_cq* cq = pod.NewCq(8);
  Loopback l(pod, cq);
  Buffer src(pod.pd, 4096);
  for (uint64_t i = 0; i < 6; ++i)
    ASSERT_EQ(PostSend(l.a, IBV_WR_RDMA_WRITE, src.Sge(0, 8), i,
                       reinterpret_cast<uintptr_t>(src.data()) + 2048, src.mr()->rkey),
              0);
  // The first poll executes all six (same-node writes complete at once) and takes one.
  ibv_wc first{};
  int n = 0;
  for (int i = 0; i < 100000 && n == 0; ++i) n = ibv_poll_cq(cq, 1, &first);
  ASSERT_EQ(n, 1);
  EXPECT_EQ(first.wr_id, 0u);
  ASSERT_EQ(ff::verbs::ToCq(cq)->tail - ff::verbs::ToCq(cq)->head, 5u);  // held by the CQ
  ASSERT_EQ(ibv_resize_cq(cq, 100), 0);
  EXPECT_GE(cq->cqe, 100);
  EXPECT_EQ(ibv_resize_cq(cq, 4), EINVAL);  // below the five it holds
  ASSERT_EQ(ibv_resize_cq(cq, 5), 0);
  EXPECT_GE(cq->cqe, 5);
  EXPECT_EQ(ibv_resize_cq(cq, 0), EINVAL);
  EXPECT_EQ(ibv_resize_cq(cq, static_cast<int>(ff::kMaxCqe) + 1), EINVAL);
  const std::vector<ibv_wc> rest = PollN(cq, 5);
  ASSERT_EQ(rest.size(), 5u);
  for (uint64_t i = 0; i < 5; ++i) EXPECT_EQ(rest[i].wr_id, 1 + i);
}

}  // namespace
}  // namespace fftest
