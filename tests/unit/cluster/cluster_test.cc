// The real library (libffverbs' sources) against real routers in one process: two pods,
// each a library session, on one router or on two routers joined by the in-memory node
// transport. Every test runs both ways, so the same verbs calls must behave the same on one
// node and across nodes: SEND/RECV, WRITE/READ/ATOMIC, RNR, error completions and the death
// of a peer, its router or the link between them. No root, no namespaces.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "pods.h"

namespace ff::cluster_test {
namespace {

TEST_P(ClusterTest, SendsArriveWholeAndInOrder) {
  ConnectBoth();
  const uint32_t sizes[] = {1, 4096, 100000, 64};
  size_t off = 0;
  for (uint32_t i = 0; i < 4; ++i) {
    ASSERT_EQ(b->PostRecv(100 + i, off, sizes[i]), 0);
    for (uint32_t j = 0; j < sizes[i]; ++j) a->buf[off + j] = static_cast<char>(i * 31 + j);
    off += sizes[i];
  }
  off = 0;
  for (uint32_t i = 0; i < 4; ++i) {
    ASSERT_EQ(a->Post(IBV_WR_SEND, i, off, sizes[i]), 0);
    off += sizes[i];
  }
  const auto sent = a->Poll(4);
  const auto got = b->Poll(4);
  ASSERT_EQ(sent.size(), 4u);
  ASSERT_EQ(got.size(), 4u);
  off = 0;
  for (uint32_t i = 0; i < 4; ++i) {
    EXPECT_EQ(sent[i].status, IBV_WC_SUCCESS);
    EXPECT_EQ(sent[i].wr_id, i);
    EXPECT_EQ(got[i].status, IBV_WC_SUCCESS);
    EXPECT_EQ(got[i].opcode, IBV_WC_RECV);
    EXPECT_EQ(got[i].wr_id, 100 + i);
    EXPECT_EQ(got[i].byte_len, sizes[i]);
    EXPECT_EQ(got[i].src_qp, a->qp->qp_num);
    EXPECT_EQ(std::memcmp(b->buf + off, a->buf + off, sizes[i]), 0) << i;
    off += sizes[i];
  }
}

// Every test here runs over the request rings (proto::RequestRing): the library hands its
// ring over at HELLO and writes requests there; those with descriptors (a QP's segment) keep
// their place in it and travel on the socket.
TEST_P(ClusterTest, LibrarySessionsSendTheirRequestsThroughTheRing) {
  for (Pod* p : {a.get(), b.get()}) {
    ff::verbs::RequestRingEnd& ring = p->session()->ring;
    ASSERT_NE(ring.control, nullptr) << "the router did not take the library's ring";
    const uint64_t before = RequestRingOf(ring.map.get())->tail.load();
    EXPECT_GT(before, 0u) << "the QP set-up of the fixture went around the ring";
    ibv_qp* qp = p->NewQp();
    ASSERT_NE(qp, nullptr);
    EXPECT_GT(RequestRingOf(ring.map.get())->tail.load(), before);
  }
  ConnectBoth();
  ASSERT_EQ(b->PostRecv(1, 0, 64), 0);
  ASSERT_EQ(a->Post(IBV_WR_SEND, 2, 0, 64), 0);
  EXPECT_EQ(a->Poll(1).size(), 1u);
  EXPECT_EQ(b->Poll(1).size(), 1u);
}

// A request with descriptors whose send fails after its place in the ring was published
// (here a descriptor that is none): the router would wait for it there forever, so the
// session ends, and the next request fails at once instead of waiting kRouterCallTimeoutS.
TEST_P(ClusterTest, ARequestWhoseSendFailsEndsTheSessionRatherThanHangIt) {
  ff::verbs::Session* s = a->session();
  ASSERT_NE(s->ring.control, nullptr);
  proto::CreateSrq m{};
  m.id = 99;
  const int bad = -1;
  proto::Response r{};
  EXPECT_EQ(s->Call(&m, sizeof(m), &bad, 1, &r), EBADF);
  const auto t0 = std::chrono::steady_clock::now();
  proto::DestroyCq next{};
  next.id = 1;
  EXPECT_EQ(s->SimpleCall(&next, sizeof(next)), ENOTCONN);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));
}

// A LID names one pod in the whole cluster (its offset in the overlay, 10.0.0.0/8 here), so
// a program that exchanges LIDs instead of GIDs reaches a pod on another node too.
TEST_P(ClusterTest, APeerAddressedByItsLidIsReachedOnAnyNode) {
  Pod x(*a_router, Ip("10.0.1.7"));
  Pod y(cross() ? *b_router : *a_router, Ip("10.0.2.9"));
  ibv_port_attr px{}, py{};
  ASSERT_EQ(ibv_query_port(x.ctx, 1, &px), 0);
  ASSERT_EQ(ibv_query_port(y.ctx, 1, &py), 0);
  EXPECT_EQ(px.lid, 0x0107);
  EXPECT_EQ(py.lid, 0x0209);
  ASSERT_EQ(y.ConnectTo(x, 7, 1, px.lid), 0);
  ASSERT_EQ(x.ConnectTo(y, 7, 1, py.lid), 0);
  ASSERT_EQ(y.PostRecv(1, 0, 64), 0);
  std::memcpy(x.buf, "by lid", 6);
  ASSERT_EQ(x.Post(IBV_WR_SEND, 2, 0, 6), 0);
  const auto got = y.Poll(1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(got[0].slid, px.lid);
  EXPECT_EQ(std::memcmp(y.buf, "by lid", 6), 0);
  ASSERT_EQ(x.Poll(1).size(), 1u);
}

// A multicast LID names no pod: a QP addressed to it fails at RTR instead of waiting.
TEST_P(ClusterTest, ALidThatNamesNoPodIsUnreachable) {
  Pod x(*a_router, Ip("10.0.1.7"));
  ASSERT_EQ(x.ConnectTo(*a, 7, 1, 0xc001), EHOSTUNREACH);  // a multicast LID: no pod
}

// ibv_req_notify_cq(cq, 1): only a message its sender marked IBV_SEND_SOLICITED raises the
// event (through the peer on one node, through both routers across nodes).
TEST_P(ClusterTest, ACqArmedForSolicitedCompletionsWaitsForOne) {
  Pod x(*a_router, Ip("10.0.1.7"));
  Pod y(cross() ? *b_router : *a_router, Ip("10.0.2.9"), true);
  ASSERT_EQ(y.ConnectTo(x), 0);
  ASSERT_EQ(x.ConnectTo(y), 0);
  ASSERT_EQ(::fcntl(y.channel->fd, F_SETFL, O_NONBLOCK), 0);
  const auto event = [&]() -> ibv_cq* {  // within 2 s, or nullptr
    for (int i = 0; i < 200; ++i) {
      ibv_cq* cq = nullptr;
      void* context = nullptr;
      if (ibv_get_cq_event(y.channel, &cq, &context) == 0) {
        ibv_ack_cq_events(cq, 1);
        return cq;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return nullptr;
  };
  ASSERT_EQ(ibv_req_notify_cq(y.cq, 1), 0);
  for (uint64_t i = 0; i < 4; ++i) ASSERT_EQ(y.PostRecv(i, 0, 64), 0);
  ASSERT_EQ(x.Post(IBV_WR_SEND, 1, 0, 8), 0);
  ASSERT_EQ(x.Poll(1).size(), 1u);
  EXPECT_EQ(event(), nullptr) << "an unsolicited message raised the event";
  x.send_flags = IBV_SEND_SOLICITED;
  ASSERT_EQ(x.Post(IBV_WR_SEND, 2, 0, 8), 0);
  EXPECT_EQ(event(), y.cq);
  EXPECT_EQ(y.Poll(2).size(), 2u);
  // WRITE_WITH_IMM carries the mark too; armed for any completion, a plain SEND fires.
  ASSERT_EQ(ibv_req_notify_cq(y.cq, 1), 0);
  ASSERT_EQ(x.Post(IBV_WR_RDMA_WRITE_WITH_IMM, 3, 0, 8, &y), 0);
  EXPECT_EQ(event(), y.cq);
  ASSERT_EQ(ibv_req_notify_cq(y.cq, 0), 0);
  x.send_flags = 0;
  ASSERT_EQ(x.Post(IBV_WR_SEND, 4, 0, 8), 0);
  EXPECT_EQ(event(), y.cq);
  EXPECT_EQ(y.Poll(2).size(), 2u);
}

TEST_P(ClusterTest, WriteReadAndAtomicsNeedNothingFromTheTarget) {
  ConnectBoth();
  std::iota(a->buf, a->buf + 70000, 3);
  ASSERT_EQ(a->Post(IBV_WR_RDMA_WRITE, 1, 0, 70000, b.get(), 4096), 0);
  auto wc = a->Poll(1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(std::memcmp(b->buf + 4096, a->buf, 70000), 0);
  ASSERT_EQ(a->Post(IBV_WR_RDMA_READ, 2, 200000, 70000, b.get(), 4096), 0);
  wc = a->Poll(1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc[0].opcode, IBV_WC_RDMA_READ);
  EXPECT_EQ(std::memcmp(a->buf + 200000, a->buf, 70000), 0);
  uint64_t* word = reinterpret_cast<uint64_t*>(b->buf + 8);
  *word = 100;
  ASSERT_EQ(a->Post(IBV_WR_ATOMIC_FETCH_AND_ADD, 3, 300000, 8, b.get(), 8, 5), 0);
  ASSERT_EQ(a->Post(IBV_WR_ATOMIC_CMP_AND_SWP, 4, 300008, 8, b.get(), 8, 105, 1), 0);
  wc = a->Poll(2);
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc[1].status, IBV_WC_SUCCESS);
  EXPECT_EQ(*reinterpret_cast<uint64_t*>(a->buf + 300000), 100u);
  EXPECT_EQ(*reinterpret_cast<uint64_t*>(a->buf + 300008), 105u);
  EXPECT_EQ(*word, 1u);
  EXPECT_TRUE(b->Poll(1, std::chrono::milliseconds(100)).empty());  // the target saw none of it
}

// IBV_WR_ATOMIC_WRITE (ibv_wr_atomic_write, and ibv_post_send with its 8 bytes as the data):
// the 8 bytes land whole, nothing comes back into the requester's memory, it needs the
// registration's remote write, an 8-byte aligned address and exactly 8 bytes.
TEST_P(ClusterTest, AnAtomicWriteStoresEightBytesWhole) {
  ConnectBoth();
  ibv_qp_ex* qpx = ibv_qp_to_qp_ex(a->qp);
  ASSERT_NE(qpx, nullptr);
  uint64_t value = 0x1122334455667788ull;
  ibv_wr_start(qpx);
  qpx->wr_id = 11;
  qpx->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_atomic_write(qpx, b->mr->rkey, reinterpret_cast<uintptr_t>(b->buf + 64), &value);
  value = 0;  // taken at the call, as a provider takes it
  ASSERT_EQ(ibv_wr_complete(qpx), 0);
  auto wc = a->Poll(1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 11u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc[0].opcode, IBV_WC_ATOMIC_WRITE);
  EXPECT_EQ(*reinterpret_cast<uint64_t*>(b->buf + 64), 0x1122334455667788ull);

  const uint64_t from_memory = 0x0102030405060708ull;
  std::memcpy(a->buf + 4096, &from_memory, 8);
  std::memset(a->buf + 4104, 0x5a, 8);
  ASSERT_EQ(a->Post(IBV_WR_ATOMIC_WRITE, 12, 4096, 8, b.get(), 128), 0);
  wc = a->Poll(1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(std::memcmp(b->buf + 128, &from_memory, 8), 0);
  EXPECT_EQ(std::memcmp(a->buf + 4096, &from_memory, 8), 0) << "nothing came back";
  EXPECT_EQ(a->buf[4104], 0x5a);
  EXPECT_EQ(a->Post(IBV_WR_ATOMIC_WRITE, 13, 4096, 4, b.get(), 128), EINVAL) << "4 bytes";
  EXPECT_TRUE(b->Poll(1, std::chrono::milliseconds(100)).empty());  // the target saw none of it

  // A misaligned address, then a registration without remote write: each fails its request
  // (and its pair of QPs).
  ibv_qp* from = NewPair();
  ASSERT_NE(from, nullptr);
  qpx = ibv_qp_to_qp_ex(from);
  ibv_wr_start(qpx);
  qpx->wr_id = 14;
  qpx->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_atomic_write(qpx, b->mr->rkey, reinterpret_cast<uintptr_t>(b->buf + 132), &value);
  ASSERT_EQ(ibv_wr_complete(qpx), 0);
  wc = a->Poll(1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_REM_INV_REQ_ERR);
  ibv_mr* atomics_only =
      ibv_reg_mr(b->pd, b->buf + 8192, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC);
  ASSERT_NE(atomics_only, nullptr);
  from = NewPair();
  ASSERT_NE(from, nullptr);
  qpx = ibv_qp_to_qp_ex(from);
  ibv_wr_start(qpx);
  qpx->wr_id = 15;
  qpx->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_atomic_write(qpx, atomics_only->rkey, reinterpret_cast<uintptr_t>(b->buf + 8192), &value);
  ASSERT_EQ(ibv_wr_complete(qpx), 0);
  wc = a->Poll(1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(ibv_dereg_mr(atomics_only), 0);
}

TEST_P(ClusterTest, WriteWithImmediateConsumesAReceive) {
  ConnectBoth();
  ASSERT_EQ(b->PostRecv(7, 0, 16), 0);
  std::memcpy(a->buf, "immediate", 9);
  ibv_sge sge{reinterpret_cast<uintptr_t>(a->buf), 9, a->mr->lkey};
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.imm_data = htonl(0xfeed);
  wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(b->buf + 512);
  wr.wr.rdma.rkey = b->mr->rkey;
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_send(a->qp, &wr, &bad), 0);
  const auto got = b->Poll(1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].opcode, IBV_WC_RECV_RDMA_WITH_IMM);
  EXPECT_EQ(ntohl(got[0].imm_data), 0xfeedu);
  EXPECT_EQ(std::string(b->buf + 512, 9), "immediate");
  EXPECT_EQ(a->Poll(1).size(), 1u);
}

TEST_P(ClusterTest, RnrRetriesRunOutWhenNoReceiveIsPosted) {
  ConnectBoth(1, 1);  // one retry, 10 us apart
  ASSERT_EQ(a->Post(IBV_WR_SEND, 1, 0, 32), 0);
  ASSERT_EQ(a->Post(IBV_WR_SEND, 2, 0, 32), 0);
  const auto wc = a->Poll(2);
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_EQ(wc[0].wr_id, 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_RNR_RETRY_EXC_ERR);
  EXPECT_EQ(wc[1].wr_id, 2u);
  EXPECT_EQ(wc[1].status, IBV_WC_WR_FLUSH_ERR);
  ibv_qp_attr attr;
  ibv_qp_init_attr init;
  ASSERT_EQ(ibv_query_qp(a->qp, &attr, IBV_QP_STATE, &init), 0);
  EXPECT_EQ(attr.qp_state, IBV_QPS_ERR);
}

TEST_P(ClusterTest, AForgedRkeyCompletesWithARemoteAccessError) {
  ConnectBoth();
  ibv_sge sge{reinterpret_cast<uintptr_t>(a->buf), 8, a->mr->lkey};
  ibv_send_wr wr{};
  wr.wr_id = 9;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(b->buf);
  wr.wr.rdma.rkey = b->mr->rkey ^ 0x100;  // another slot
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_send(a->qp, &wr, &bad), 0);
  const auto wc = a->Poll(1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_REM_ACCESS_ERR);
}

// A zero-length WRITE or READ names no memory: no R_Key or address is checked (UCX flushes
// with rkey 0 and address 0), but the target QP must still allow the access.
TEST_P(ClusterTest, AZeroLengthWriteOrReadNeedsNoKeyButTheQpsAccess) {
  ConnectBoth();
  for (const ibv_wr_opcode op : {IBV_WR_RDMA_WRITE, IBV_WR_RDMA_READ}) {
    ibv_send_wr wr{};
    wr.wr_id = 11;
    wr.opcode = op;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.num_sge = 0;
    wr.wr.rdma.remote_addr = 0;
    wr.wr.rdma.rkey = 0;
    ibv_send_wr* bad = nullptr;
    ASSERT_EQ(ibv_post_send(a->qp, &wr, &bad), 0);
    const auto wc = a->Poll(1);
    ASSERT_EQ(wc.size(), 1u);
    EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS) << op;
  }
  // The target QP takes reads only now: a zero-length WRITE is refused all the same.
  ibv_qp_attr attr{};
  attr.qp_access_flags = IBV_ACCESS_REMOTE_READ;
  ASSERT_EQ(ibv_modify_qp(b->qp, &attr, IBV_QP_ACCESS_FLAGS), 0);
  ibv_send_wr wr{};
  wr.wr_id = 12;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_send(a->qp, &wr, &bad), 0);
  const auto wc = a->Poll(1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].status, IBV_WC_REM_ACCESS_ERR);
}

TEST_P(ClusterTest, APeerWhoseProcessDiesFailsTheQpWithoutAHang) {
  ConnectBoth();
  ASSERT_EQ(a->PostRecv(1, 0, 64), 0);
  b->Die();
  ASSERT_EQ(a->Post(IBV_WR_SEND, 2, 0, 8), 0);
  const auto wc = a->Poll(2);
  ASSERT_EQ(wc.size(), 2u);
  for (const ibv_wc& w : wc) EXPECT_NE(w.status, IBV_WC_SUCCESS);
}

// A NIC completes a receive as the message arrives; the library does when its program
// polls. A message that arrived before the program moved the QP to ERR was received all
// the same (its sender saw it complete): it completes first, then the receives left are
// flushed. UCX's client lost the sum a server sent just before disconnecting when its
// async thread moved the QP to ERR before the sum was polled (integration.rdmacm.same.
// ucp-sockaddr failed 6 of 22 runs beside a CPU-bound process).
TEST_P(ClusterTest, AMessageThatArrivedBeforeTheQpWentToErrorIsReceived) {
  ConnectBoth();
  for (uint64_t id = 1; id <= 3; ++id) ASSERT_EQ(a->PostRecv(id, 64 * id, 64), 0);
  std::memset(b->buf, 'm', 64);
  ASSERT_EQ(b->Post(IBV_WR_SEND, 9, 0, 64), 0);
  const auto sent = b->Poll(1);
  ASSERT_EQ(sent.size(), 1u);
  ASSERT_EQ(sent[0].status, IBV_WC_SUCCESS);  // it arrived; a has not polled yet
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  ASSERT_EQ(ibv_modify_qp(a->qp, &attr, IBV_QP_STATE), 0);
  const auto wc = a->Poll(3);
  ASSERT_EQ(wc.size(), 3u);
  ExpectWc(wc[0], 1, IBV_WC_SUCCESS, IBV_WC_RECV);
  EXPECT_EQ(wc[0].byte_len, 64u);
  EXPECT_EQ(std::memcmp(a->buf + 64, b->buf, 64), 0);
  for (size_t i = 1; i < 3; ++i) {
    EXPECT_EQ(wc[i].wr_id, i + 1);
    EXPECT_EQ(wc[i].status, IBV_WC_WR_FLUSH_ERR);
  }
  // What comes after the transition is dropped, as on a NIC in ERR.
  ASSERT_EQ(b->Post(IBV_WR_SEND, 10, 0, 64), 0);
  b->Poll(1);
  EXPECT_TRUE(a->Poll(1, std::chrono::milliseconds(100)).empty());
}

// A message longer than its receive fails the receiving RC QP (IBV_WC_LOC_LEN_ERR); what
// its peer sent after it, though already in the ring, is not received: the rest flush.
TEST_P(ClusterTest, NothingAfterAMessageTooLongForItsReceiveIsReceived) {
  ConnectBoth();
  ASSERT_EQ(a->PostRecv(1, 0, 16), 0);
  ASSERT_EQ(a->PostRecv(2, 64, 64), 0);
  ASSERT_EQ(a->PostRecv(3, 128, 64), 0);
  ASSERT_EQ(b->Post(IBV_WR_SEND, 7, 0, 64), 0);  // too long for receive 1
  ASSERT_EQ(b->Post(IBV_WR_SEND, 8, 0, 8), 0);
  ASSERT_EQ(b->Poll(2).size(), 2u);  // both arrived before a polls
  const auto wc = a->Poll(3);
  ASSERT_EQ(wc.size(), 3u);
  ExpectWc(wc[0], 1, IBV_WC_LOC_LEN_ERR, IBV_WC_RECV);
  EXPECT_EQ(wc[1].wr_id, 2u);
  EXPECT_EQ(wc[1].status, IBV_WC_WR_FLUSH_ERR);
  EXPECT_EQ(wc[2].wr_id, 3u);
  EXPECT_EQ(wc[2].status, IBV_WC_WR_FLUSH_ERR);
}

TEST_P(ClusterTest, ALinkOrRouterThatDiesFailsTheQpWithoutAHang) {
  ConnectBoth();
  ASSERT_EQ(a->Post(IBV_WR_RDMA_WRITE, 1, 0, 64, b.get(), 0), 0);
  ASSERT_EQ(a->Poll(1).size(), 1u);
  if (cross()) {
    net.Sever("node-a", "node-b");  // the link between the two routers dies
  } else {
    a_router.reset();  // on one node: the router itself goes away
  }
  // Give the news time to arrive, then use the QP: its work fails, nothing hangs. (The
  // library raises the async event when the application next touches the QP; a real HCA
  // raises it on its own.)
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_EQ(a->Post(IBV_WR_SEND, 2, 0, 8), 0);
  const auto wc = a->Poll(1);
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_NE(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(a->AsyncEvent(), cross() ? IBV_EVENT_QP_FATAL : IBV_EVENT_DEVICE_FATAL);
}

// How many mappings of memfds named `name` this process holds (/proc/self/maps).
// Mappings of memfds named `name`, or of the router's tables named so (base/table_store.h:
// files of its tmpfs, "/<name>-<number> (deleted)").
size_t Mapped(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  size_t n = 0;
  for (std::string line; std::getline(maps, line);) {
    const bool memfd = line.find("/memfd:" + name + " ") != std::string::npos;
    const bool table = line.find(" /" + name + "-") != std::string::npos;
    n += memfd || table ? 1 : 0;
  }
  return n;
}

// A program that connects QP after QP to one peer process on its node (an rdma_cm client)
// maps that peer's notify words and MR table once: they stay mapped between connections
// (Context::recent_peers), and every QP still works.
TEST(PeerMappings, QpsLinkedOneAfterAnotherToAPeerMapItsMrTableOnce) {
  TestRouter router{TestRouter::Options{}};
  Pod a(router, Ip("10.0.0.1")), b(router, Ip("10.0.0.2"));
  const size_t tables = Mapped("ffrouter-mrtable"), notify = Mapped("ffverbs-notify");
  for (int i = 0; i < 3; ++i) {
    ibv_qp* qa = a.NewQp();
    ibv_qp* qb = b.NewQp();
    ASSERT_NE(qa, nullptr);
    ASSERT_NE(qb, nullptr);
    ASSERT_EQ(b.ConnectQp(qb, a, qa->qp_num), 0);
    ASSERT_EQ(a.ConnectQp(qa, b, qb->qp_num), 0);
    // a maps b's, and b (told that a named it) a's.
    EXPECT_TRUE(router::test::WaitFor([&] { return Mapped("ffrouter-mrtable") == tables + 2; }))
        << "connection " << i << ": " << Mapped("ffrouter-mrtable") - tables;
    ibv_sge sge{reinterpret_cast<uintptr_t>(a.buf), 8, a.mr->lkey};
    ibv_send_wr wr{};
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = reinterpret_cast<uintptr_t>(b.buf) + 64 * i;
    wr.wr.rdma.rkey = b.mr->rkey;
    std::memcpy(a.buf, "written", 8);
    ibv_send_wr* bad = nullptr;
    ASSERT_EQ(ibv_post_send(qa, &wr, &bad), 0);
    const auto done = a.Poll(1);
    ASSERT_EQ(done.size(), 1u);
    EXPECT_EQ(done[0].status, IBV_WC_SUCCESS);
    EXPECT_STREQ(b.buf + 64 * i, "written");
    ASSERT_EQ(a.DestroyQp(qa), 0);
    ASSERT_EQ(b.DestroyQp(qb), 0);
    EXPECT_EQ(Mapped("ffrouter-mrtable"), tables + 2) << "unmapped with the last link";
    EXPECT_EQ(Mapped("ffverbs-notify"), notify + 2) << "unmapped with the last link";
  }
}

// An RC connect past the pod's quota of cross-node channels fails at RTR with ENOSPC, and
// the program's stderr says which quota (UCX only reported "local work queue catastrophic
// error" for the 20-rank MPI job over rc_verbs that met it).
TEST(ChannelQuota, AConnectPastItFailsAndSaysWhichQuota) {
  LoopbackNetwork net;
  FakeCluster cluster;
  TestRouter::Options options{"node-a", Ip("192.168.0.1"), &net, &cluster};
  options.limits = router::test::WithLimits({{router::Quota::kProxies, 1}});
  TestRouter a_router(options);
  TestRouter b_router(TestRouter::Options{"node-b", Ip("192.168.0.2"), &net, &cluster});
  Pod a(a_router, Ip("10.1.0.1")), b(b_router, Ip("10.2.0.1"));
  ASSERT_EQ(b.ConnectTo(a), 0);
  ASSERT_EQ(a.ConnectTo(b), 0);  // the one channel the pod may hold
  ibv_qp* mine = a.NewQp();
  ibv_qp* theirs = b.NewQp();
  ASSERT_NE(mine, nullptr);
  ASSERT_NE(theirs, nullptr);
  ASSERT_EQ(b.ConnectQp(theirs, a, mine->qp_num), 0);
  ::testing::internal::CaptureStderr();
  const int rc = a.ConnectQp(mine, b, theirs->qp_num);
  const std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(rc, ENOSPC);
  EXPECT_NE(said.find("--max-proxies-per-pod"), std::string::npos) << said;
}

// A hostile pod that resolves a UD destination writes records claiming another source
// (another pod's address and QPN). The receiving library reports the sender the router
// gave the ring to, never what the record says; and the sender's ring is a memfd of its
// own, so it cannot write into another sender's.
TEST(UdIdentity, AUdSenderCannotClaimAnotherSource) {
  TestRouter router{TestRouter::Options{}};
  Pod victim(router, Ip("10.0.0.1"));
  ibv_qp_init_attr init{};
  init.send_cq = victim.cq;
  init.recv_cq = victim.cq;
  init.qp_type = IBV_QPT_UD;
  init.cap = {16, 16, 1, 1, 0};
  ibv_qp* ud = ibv_create_qp(victim.pd, &init);
  ASSERT_NE(ud, nullptr);
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qkey = 0x1111;
  ASSERT_EQ(ibv_modify_qp(ud, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY), 0);
  a = {};
  a.qp_state = IBV_QPS_RTR;
  ASSERT_EQ(ibv_modify_qp(ud, &a, IBV_QP_STATE), 0);
  ibv_sge sge{reinterpret_cast<uintptr_t>(victim.buf), 256, victim.mr->lkey};
  ibv_recv_wr wr{};
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_recv(ud, &wr, &bad), 0);

  router::test::RawPod forger(router, Ip("10.0.0.66"));
  ASSERT_EQ(forger.Hello(), 0);
  const router::test::RawQp mine = forger.CreateQp(IBV_QPT_UD, kUdRingsPerQp, kUdRingBytes);
  router::test::RawLink link = forger.Connect(mine, Ip("10.0.0.1"), ud->qp_num, true);
  ASSERT_EQ(link.status, 0);
  ASSERT_TRUE(link.reply.flags & proto::kConnectOwnRing);
  RecordHeader h{};
  h.kind = kRecSend;
  h.flags = kRecFirst | kRecLast;
  h.qkey = 0x1111;
  h.src_qpn = 0x4242;                // a QP of someone else...
  h.src_ip = htonl(Ip("10.0.0.2"));  // ...at someone else's address
  ASSERT_EQ(AppendRecord(link.producer, h, "forged", 6), RingStatus::kOk);
  link.producer.Publish();

  ibv_wc wc{};
  ASSERT_TRUE(router::test::WaitFor([&] { return ibv_poll_cq(victim.cq, 1, &wc) == 1; }));
  EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc.src_qp, mine.qpn);
  EXPECT_EQ(wc.slid, LidForIp(Ip("10.0.0.66"), *Ipv4Prefix::Parse("10.0.0.0/8")));
  const auto* grh = reinterpret_cast<const ibv_grh*>(victim.buf);
  uint8_t expected[16];
  Ipv4MappedGid(Ip("10.0.0.66"), expected);
  EXPECT_EQ(std::memcmp(grh->sgid.raw, expected, 16), 0);
  EXPECT_EQ(std::memcmp(victim.buf + sizeof(ibv_grh), "forged", 6), 0);
  ibv_destroy_qp(ud);
}

INSTANTIATE_TEST_SUITE_P(Nodes, ClusterTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "AcrossNodes" : "OneNode";
                         });

}  // namespace
}  // namespace ff::cluster_test
