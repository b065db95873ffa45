// A session's request ring (proto::RequestRing): requests written to shared memory, those
// with descriptors on the socket in their place, the doorbell of a sleeping router, the
// order across pods, and what a pod that breaks the ring gets (only itself disconnected).
#include <gtest/gtest.h>
#include <infiniband/verbs.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <thread>
#include <tuple>

#include "harness.h"

namespace ff::router::test {
namespace {

// A pod that hands the router a request ring and writes its requests there itself.
class RingPod {
 public:
  RingPod(TestRouter& router, uint32_t ip) : pod(router, ip) {}

  // HELLO, then the ring: the router's answer to proto::RequestRing.
  int Start() {
    if (const int rc = pod.Hello()) return rc;
    return HandOver();
  }
  int HandOver(uint32_t bytes = kRequestRingBytes) {
    const size_t size = RequestRingSegmentBytes(kRequestRingBytes);
    proto::RequestRing m{};
    m.bytes = bytes;
    if (handed_over) {  // a second ring: asked for as any request with descriptors now is
      UniqueFd another;
      EXPECT_EQ(CreateSegment("test-requests", size, &another), 0);
      WriteWithFds(m, 77, {another.get()});
      const auto [seq, status] = Answer();
      EXPECT_EQ(seq, 77u);
      return status;
    }
    if (!fd && (CreateSegment("test-requests", size, &fd) != 0 ||
                MapSegment(fd.get(), size, true, &map) != 0))
      return -1;
    producer.Attach(RequestRingOf(map.get()), kRequestRingBytes);
    control = map.as<RequestRingControl>();
    const int status = pod.Call(m, {fd.get()}).status;
    handed_over = status == 0;
    return status;
  }

  // Writes one record: `kind`, published at `at` (0: now), `len` bytes of `req` after it.
  void Record(uint8_t kind, const void* req, size_t len, uint64_t at = 0) {
    const uint32_t payload = static_cast<uint32_t>(sizeof(uint64_t) + len);
    char* where = nullptr;
    ASSERT_EQ(producer.Reserve(RecordBytes(payload), &where), RingStatus::kOk);
    RecordHeader h{};
    h.total = RecordBytes(payload);
    h.kind = kind;
    h.frag_len = payload;
    if (at == 0) at = MonotonicNs();
    std::memcpy(where, &h, sizeof(h));
    std::memcpy(where + sizeof(h), &at, sizeof(at));
    if (len != 0) std::memcpy(where + sizeof(h) + sizeof(at), req, len);
    producer.Commit(h.total);
    producer.Publish();
  }
  // Request `m` numbered `seq` (kPostedSeq: posted) into the ring.
  template <typename M>
  void Write(M m, uint32_t seq, uint64_t at = 0) {
    m.h.op = proto::OpOf<M>;
    m.h.seq = seq;
    Record(kRecRequest, &m, sizeof(m), at);
  }
  // A request with descriptors: its place in the ring, then the request on the socket.
  template <typename M>
  void WriteWithFds(M m, uint32_t seq, const std::vector<int>& fds, uint64_t at = 0) {
    Record(kRecOnSocket, nullptr, 0, at);
    m.h.op = proto::OpOf<M>;
    m.h.seq = seq;
    pod.SendRaw(&m, sizeof(m), fds);
  }
  void Doorbell() {
    proto::Doorbell d{};
    d.h.op = proto::Op::kDoorbell;
    d.h.seq = proto::kPostedSeq;
    pod.SendRaw(&d, sizeof(d));
  }
  // Waits until the router sleeps (it says so in the ring's control block).
  bool WaitAsleep() {
    return WaitFor([&] { return control->sleeping.load() == 1; });
  }
  // The next answer: its seq and status (seq 0 when none came).
  std::pair<uint32_t, int> Answer() {
    const proto::Response r = pod.Receive();
    return {r.status < 0 ? 0 : r.h.seq, r.status};
  }

  RawPod pod;
  UniqueFd fd;
  Mapping map;
  RingProducer producer;
  RequestRingControl* control = nullptr;
  bool handed_over = false;
};

proto::CreateCq Cq(uint32_t id) {
  proto::CreateCq m{};
  m.cq_id = id;
  m.notify_slot = proto::kNoId;
  m.chan_id = proto::kNoId;
  return m;
}

// A QP segment as the library makes one (qp.cc InitSegment), and the create that hands it
// over on CQ `cq` (under number `granted`, 0: the router numbers it).
struct QpSegment {
  UniqueFd fd;
  Mapping map;
  proto::CreateQp create{};
};
QpSegment Segment(uint32_t cq, uint32_t granted = 0) {
  QpSegment q;
  const size_t bytes = QpSegmentBytes(1, kRcRingBytes);
  EXPECT_EQ(CreateSegment("test-qp", bytes, &q.fd), 0);
  EXPECT_EQ(MapSegment(q.fd.get(), bytes, true, &q.map), 0);
  auto* hdr = new (q.map.get()) QpSegmentHeader();
  hdr->magic = kQpSegMagic;
  hdr->abi = kAbiVersion;
  hdr->num_rings = 1;
  hdr->ring_bytes = kRcRingBytes;
  q.create.qp_type = IBV_QPT_RC;
  q.create.num_rings = 1;
  q.create.ring_bytes = kRcRingBytes;
  q.create.srq_id = proto::kNoId;
  q.create.recv_cq_id = cq;
  q.create.send_cq_id = cq;
  q.create.qpn = granted;
  return q;
}

class RequestRingTest : public ::testing::Test {
 protected:
  TestRouter router{TestRouter::Options{}};
};

TEST_F(RequestRingTest, ARequestInTheRingIsServedAndAnsweredOnTheSocket) {
  RingPod a(router, Ip("10.0.0.1"));
  ASSERT_EQ(a.Start(), 0);
  a.Write(Cq(1), 7);
  a.Doorbell();  // whether or not the router sleeps: a doorbell too many is harmless
  EXPECT_EQ(a.Answer(), std::make_pair(7u, 0));
  a.Write(Cq(1), 8);  // served, not just answered: CQ 1 exists now
  a.Doorbell();
  EXPECT_EQ(a.Answer(), std::make_pair(8u, EEXIST));
}

// Requests before and after one with descriptors are served in the order they were written:
// the QP uses the CQ created just before it, and the CQ's destroy waits for the QP.
TEST_F(RequestRingTest, ARequestWithDescriptorsIsServedInItsPlace) {
  RingPod a(router, Ip("10.0.0.1"));
  ASSERT_EQ(a.Start(), 0);
  QpSegment q = Segment(5);
  a.Write(Cq(5), 1);
  a.WriteWithFds(q.create, 2, {q.fd.get()});
  QpSegment q2 = Segment(6);  // a second QP, on a CQ that does not exist yet
  a.WriteWithFds(q2.create, 3, {q2.fd.get()});
  a.Write(Cq(6), 4);
  a.Doorbell();
  EXPECT_EQ(a.Answer(), std::make_pair(1u, 0));
  EXPECT_EQ(a.Answer(), std::make_pair(2u, 0));
  EXPECT_EQ(a.Answer().first, 3u);  // refused or not: in its place
  EXPECT_EQ(a.Answer(), std::make_pair(4u, 0));
  EXPECT_EQ(router.Stat("qps"), 1u);
}

TEST_F(RequestRingTest, ASleepingRouterSaysSoAndItsDoorbellWakesIt) {
  RingPod a(router, Ip("10.0.0.1"));
  ASSERT_EQ(a.Start(), 0);
  ASSERT_TRUE(a.WaitAsleep()) << "an idle router never marked the ring";
  a.Write(Cq(1), 3);
  ASSERT_EQ(a.control->sleeping.exchange(0), 1u);
  a.Doorbell();
  EXPECT_EQ(a.Answer(), std::make_pair(3u, 0));
}

// Each ring's control block shows the CPU the router runs on (plus one), so that a library
// does not poll for an answer there: at once for a ring handed over after the router ran.
TEST_F(RequestRingTest, TheRingShowsTheCpuTheRouterRunsOn) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  ASSERT_EQ(::sched_getaffinity(0, sizeof(allowed), &allowed), 0);
  const auto a_cpu_we_may_run_on = [&](uint32_t shown) {
    return shown != 0 && shown <= CPU_SETSIZE && CPU_ISSET(shown - 1, &allowed);
  };
  RingPod a(router, Ip("10.0.0.1"));
  ASSERT_EQ(a.Start(), 0);
  a.Write(Cq(1), 7);
  a.Doorbell();
  ASSERT_EQ(a.Answer(), std::make_pair(7u, 0));
  EXPECT_TRUE(a_cpu_we_may_run_on(a.control->router_cpu.load())) << a.control->router_cpu.load();
  RingPod b(router, Ip("10.0.0.2"));
  ASSERT_EQ(b.Start(), 0);
  EXPECT_TRUE(a_cpu_we_may_run_on(b.control->router_cpu.load())) << b.control->router_cpu.load();
}

// Two pods' rings are served oldest request first, whatever order the router took the rings
// in: pod B connects to a QP pod A created just before (posted, under a granted number), as a
// program does once its peer has told it the number. Served newest first, B's connect would
// find no QP (EHOSTUNREACH).
TEST_F(RequestRingTest, RingsAreServedOldestFirstAcrossPods) {
  RingPod b(router, Ip("10.0.0.2")), a(router, Ip("10.0.0.1"));
  ASSERT_EQ(b.Start(), 0);  // B's ring first
  ASSERT_EQ(a.Start(), 0);
  // Each: CQ 1 and an answered QP on it (A's answer grants the numbers).
  QpSegment first = Segment(1), qb = Segment(1);
  proto::Response r{}, rb{};
  for (auto [pod, seg, answer] : {std::tuple{&a, &first, &r}, std::tuple{&b, &qb, &rb}}) {
    pod->Write(Cq(1), 1);
    pod->WriteWithFds(seg->create, 2, {seg->fd.get()});
    pod->Doorbell();
    ASSERT_EQ(pod->Answer(), std::make_pair(1u, 0));
    *answer = pod->pod.Receive();
    ASSERT_EQ(answer->status, 0);
  }
  ASSERT_GT(r.u.create_qp.grant_count, 0u);
  const uint32_t granted = r.u.create_qp.grant[0];

  ASSERT_TRUE(a.WaitAsleep());
  ASSERT_TRUE(b.WaitAsleep());
  const uint64_t t = MonotonicNs();
  proto::ConnectQp c{};
  c.qpn = rb.u.create_qp.qpn;
  c.dest_ip = htonl(Ip("10.0.0.1"));
  c.dest_qpn = granted;
  b.Write(c, 9, t + 1000);  // written first, but published after A's create
  QpSegment qa = Segment(1, granted);
  a.WriteWithFds(qa.create, proto::kPostedSeq, {qa.fd.get()}, t);  // its socket wakes the router
  const auto [seq, status] = b.Answer();
  EXPECT_EQ(seq, 9u);
  EXPECT_NE(status, EHOSTUNREACH) << "B's connect was served before A's older create";
}

// ---- what a pod that breaks the ring gets: disconnected, alone ------------------------------

class BrokenRingTest : public RequestRingTest {
 protected:
  // `a` is disconnected; a pod without a ring, and one with a ring, are still served.
  void ExpectOnlyADropped() {
    EXPECT_TRUE(a.pod.Disconnected());
    EXPECT_EQ(other.pod.Call(Cq(1)).status, 0);
    ring.Write(Cq(1), 5);
    ring.Doorbell();
    EXPECT_EQ(ring.Answer(), std::make_pair(5u, 0));
  }
  void SetUp() override {
    ASSERT_EQ(other.pod.Hello(), 0);
    ASSERT_EQ(ring.Start(), 0);
    ASSERT_EQ(a.Start(), 0);
  }
  // A CreateCq as it goes into the ring: op `op`, posted.
  static proto::CreateCq Request(proto::Op op = proto::Op::kCreateCq) {
    proto::CreateCq c = Cq(1);
    c.h.op = op;
    c.h.seq = proto::kPostedSeq;
    return c;
  }
  RingPod other{router, Ip("10.0.0.8")};
  RingPod ring{router, Ip("10.0.0.9")};
  RingPod a{router, Ip("10.0.0.1")};  // the pod that breaks its ring
};

TEST_F(BrokenRingTest, IndicesOutsideTheRing) {
  RequestRingOf(a.map.get())->tail.store(kRequestRingBytes * 2 + 64);
  a.Doorbell();
  ExpectOnlyADropped();
}

TEST_F(BrokenRingTest, MisalignedTail) {
  RequestRingOf(a.map.get())->tail.store(17);
  a.Doorbell();
  ExpectOnlyADropped();
}

TEST_F(BrokenRingTest, ARecordLongerThanAnyRequest) {
  std::vector<char> big(proto::kMaxMessage + 64, 0);
  const proto::CreateCq c = Request();
  std::memcpy(big.data(), &c, sizeof(c));
  a.Record(kRecRequest, big.data(), big.size());
  a.Doorbell();
  ExpectOnlyADropped();
}

TEST_F(BrokenRingTest, ARecordOfAnotherKind) {
  const proto::CreateCq c = Request();
  a.Record(kRecSend, &c, sizeof(c));
  a.Doorbell();
  ExpectOnlyADropped();
}

TEST_F(BrokenRingTest, ARequestThatIsNoRequest) {
  const proto::CreateCq c = Request(proto::Op::kMaxOp);
  a.Record(kRecRequest, &c, sizeof(c));
  a.Doorbell();
  ExpectOnlyADropped();
}

TEST_F(BrokenRingTest, ARequestOnTheSocketWithoutItsPlace) {
  const proto::CreateCq c = Request();
  a.pod.SendRaw(&c, sizeof(c));
  ExpectOnlyADropped();
}

// A place held for a request that never comes: the router waits for the socket, without
// polling for it, and serves everyone else meanwhile.
TEST_F(BrokenRingTest, APlaceWhoseRequestNeverComesCostsTheRouterNothing) {
  a.Record(kRecOnSocket, nullptr, 0);
  a.Doorbell();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const uint64_t cpu0 = router.CpuNs();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_LT(router.CpuNs() - cpu0, 60'000'000u) << "the router polled for the missing request";
  EXPECT_EQ(other.pod.Call(Cq(1)).status, 0);
  ring.Write(Cq(1), 5);
  ring.Doorbell();
  EXPECT_EQ(ring.Answer(), std::make_pair(5u, 0));
  EXPECT_FALSE(a.pod.Disconnected(10));
}

// A pod that rewrites a record's length while the router reads it: the router reads a
// record's header once, checks that copy and uses it, so it drops the pod instead of copying
// past its buffer. Each round publishes a request and flips its length between a request's
// and 16 times the largest request's, ringing as it goes.
TEST_F(BrokenRingTest, ARecordRewrittenWhileTheRouterReadsIt) {
  constexpr uint32_t kAt = sizeof(uint64_t);
  const uint32_t small = kAt + sizeof(proto::CreateCq);
  const uint32_t huge = 16 * proto::kMaxMessage;
  bool dropped = false;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
  for (uint32_t round = 1; !dropped && std::chrono::steady_clock::now() < until; ++round) {
    char* where = nullptr;
    if (a.producer.Reserve(RecordBytes(huge), &where) != RingStatus::kOk) {
      dropped = a.pod.Disconnected(50);  // full: the router stopped reading (dropped us)
      break;
    }
    RecordHeader h{};
    h.total = RecordBytes(huge);
    h.kind = kRecRequest;
    h.frag_len = small;
    proto::CreateCq c = Request();
    c.cq_id = round;
    const uint64_t at = MonotonicNs();
    std::memcpy(where, &h, sizeof(h));
    std::memcpy(where + sizeof(h), &at, sizeof(at));
    std::memcpy(where + sizeof(h) + kAt, &c, sizeof(c));
    a.producer.Commit(h.total);
    a.producer.Publish();
    auto* live = reinterpret_cast<RecordHeader*>(where);
    for (int flip = 0; flip < 64; ++flip) {
      __atomic_store_n(&live->frag_len, flip % 2 == 0 ? huge : small, __ATOMIC_RELAXED);
      if (flip % 16 == 0) a.Doorbell();
    }
    dropped = a.pod.Disconnected(0);
  }
  ExpectOnlyADropped();
}

TEST_F(RequestRingTest, TheRingIsTakenOnceSealedAndOfItsSize) {
  RingPod a(router, Ip("10.0.0.1"));
  ASSERT_EQ(a.pod.Hello(), 0);
  EXPECT_EQ(a.HandOver(kRequestRingBytes / 2), EINVAL);
  ASSERT_EQ(a.HandOver(), 0);
  EXPECT_EQ(a.HandOver(), EINVAL) << "a second ring";

  RingPod unsealed(router, Ip("10.0.0.2"));
  ASSERT_EQ(unsealed.pod.Hello(), 0);
  const size_t size = RequestRingSegmentBytes(kRequestRingBytes);
  unsealed.fd.reset(::memfd_create("unsealed", MFD_CLOEXEC));
  ASSERT_EQ(::ftruncate(unsealed.fd.get(), static_cast<off_t>(size)), 0);
  ASSERT_EQ(MapSegment(unsealed.fd.get(), size, true, &unsealed.map), 0);
  EXPECT_EQ(unsealed.HandOver(), EINVAL) << "a ring the pod could shrink under the router";

  RingPod dirty(router, Ip("10.0.0.3"));
  ASSERT_EQ(dirty.pod.Hello(), 0);
  ASSERT_EQ(CreateSegment("test-requests", size, &dirty.fd), 0);
  ASSERT_EQ(MapSegment(dirty.fd.get(), size, true, &dirty.map), 0);
  RequestRingOf(dirty.map.get())->head.store(33);
  EXPECT_EQ(dirty.HandOver(), EINVAL) << "a ring that does not start empty and aligned";
}

TEST_F(RequestRingTest, NoRingBeforeHello) {
  RingPod a(router, Ip("10.0.0.1"));
  EXPECT_NE(a.HandOver(), 0);
  EXPECT_TRUE(a.pod.Disconnected());
}

}  // namespace
}  // namespace ff::router::test
