#include "pod.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace fftest {

ListeningRouter::ListeningRouter() {
  char dir[] = "/tmp/ffv-router-XXXXXX";
  if (::mkdtemp(dir) == nullptr) {
    ADD_FAILURE() << "mkdtemp: " << std::strerror(errno);
    return;
  }
  dir_ = dir;
  Listen();
}

ListeningRouter::ListeningRouter(const std::string& dir) : dir_(dir), own_dir_(false) { Listen(); }

void ListeningRouter::Listen() {
  path_ = dir_ + "/ffrouter.sock";
  listener_.reset(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path_.c_str(), path_.size() + 1);
  if (!listener_ ||
      ::bind(listener_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(listener_.get(), 1) != 0) {
    ADD_FAILURE() << "cannot listen at " << path_ << ": " << std::strerror(errno);
    return;
  }
  acceptor_ = std::thread([this] {
    pollfd p{listener_.get(), POLLIN, 0};
    const int ms = static_cast<int>(std::chrono::milliseconds(kWaitLimit).count());
    if (::poll(&p, 1, ms) == 1)
      router_ =
          std::make_unique<FakeRouter>(ff::UniqueFd(::accept(listener_.get(), nullptr, nullptr)));
  });
}

ListeningRouter::~ListeningRouter() {
  if (acceptor_.joinable()) acceptor_.join();
  if (!path_.empty()) ::unlink(path_.c_str());
  if (own_dir_ && !dir_.empty()) ::rmdir(dir_.c_str());
}

FakeRouter* ListeningRouter::Accepted() {
  if (acceptor_.joinable()) acceptor_.join();
  return router_.get();
}
namespace {

constexpr uint32_t kPeerIp = 0x0af40002;  // 10.244.0.2, what the fake router reports

void PeerGid(ibv_gid* gid) {
  std::memset(gid, 0, sizeof(*gid));
  gid->raw[10] = 0xff;
  gid->raw[11] = 0xff;
  const uint32_t be = htonl(kPeerIp);
  std::memcpy(gid->raw + 12, &be, 4);
}

}  // namespace

Buffer::Buffer(ibv_pd* pd, size_t bytes, int access) : bytes_(bytes) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  mapped_ = (bytes + page - 1) / page * page;
  void* p = ::mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    ADD_FAILURE() << "mmap: " << std::strerror(errno);
    return;
  }
  data_ = static_cast<char*>(p);
  mr_ = ibv_reg_mr(pd, data_, bytes, access);
  EXPECT_NE(mr_, nullptr) << "ibv_reg_mr: " << std::strerror(errno);
}

Buffer::~Buffer() {
  if (mr_ != nullptr) ibv_dereg_mr(mr_);
  if (data_ != nullptr) ::munmap(data_, mapped_);
}

ibv_sge Buffer::Sge(size_t offset, uint32_t length) const {
  return ibv_sge{reinterpret_cast<uintptr_t>(data_ + offset), length, lkey()};
}

Pod::Pod() {
  int error = 0;
  session = ff::verbs::OpenSession(router.TakePodEnd(), "fake router", &error);
  if (session == nullptr) {
    ADD_FAILURE() << "OpenSession: " << std::strerror(error);
    return;
  }
  ctx = ff::verbs::OpenContext(session);
  EXPECT_NE(ctx, nullptr);
  pd = ibv_alloc_pd(ctx);
  cq = NewCq();
}

Pod::~Pod() {
  if (session == nullptr) return;
  for (ibv_qp* qp : qps_) ibv_destroy_qp(qp);
  for (ibv_ah* ah : ahs_) ibv_destroy_ah(ah);
  for (ibv_cq* c : cqs_) ibv_destroy_cq(c);
  for (ibv_comp_channel* ch : channels_) ibv_destroy_comp_channel(ch);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
  ff::verbs::CloseSession(session);
}

ibv_cq* Pod::NewCq(int cqe, ibv_comp_channel* channel) {
  ibv_cq* c = ibv_create_cq(ctx, cqe, nullptr, channel, 0);
  EXPECT_NE(c, nullptr);
  if (c != nullptr) cqs_.push_back(c);
  return c;
}

ibv_comp_channel* Pod::NewChannel() {
  ibv_comp_channel* ch = ibv_create_comp_channel(ctx);
  EXPECT_NE(ch, nullptr) << std::strerror(errno);
  if (ch != nullptr) channels_.push_back(ch);
  return ch;
}

ibv_ah* Pod::NewAh() {
  ibv_ah_attr a{};
  a.is_global = 1;
  PeerGid(&a.grh.dgid);
  a.port_num = 1;
  ibv_ah* ah = ibv_create_ah(pd, &a);
  EXPECT_NE(ah, nullptr);
  if (ah != nullptr) ahs_.push_back(ah);
  return ah;
}

int Pod::DestroyQp(ibv_qp* qp) {
  qps_.erase(std::remove(qps_.begin(), qps_.end(), qp), qps_.end());
  return ibv_destroy_qp(qp);
}

ibv_qp* Pod::CreateQp(const QpOptions& o) {
  ibv_qp_init_attr init{};
  init.send_cq = o.send_cq != nullptr ? o.send_cq : cq;
  init.recv_cq = o.recv_cq != nullptr ? o.recv_cq : cq;
  init.srq = o.srq;
  init.qp_type = o.type;
  init.sq_sig_all = o.sq_sig_all ? 1 : 0;
  init.cap.max_send_wr = 64;
  init.cap.max_recv_wr = 64;
  init.cap.max_send_sge = 4;
  init.cap.max_recv_sge = 4;
  ibv_qp* qp = ibv_create_qp(pd, &init);
  EXPECT_NE(qp, nullptr) << std::strerror(errno);
  if (qp == nullptr) return nullptr;
  qps_.push_back(qp);
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qkey = 0x1111;
  a.qp_access_flags = o.access;
  const int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                   (o.type == IBV_QPT_UD ? IBV_QP_QKEY : IBV_QP_ACCESS_FLAGS);
  EXPECT_EQ(ibv_modify_qp(qp, &a, mask), 0);
  return qp;
}

int Pod::Connect(ibv_qp* qp, uint32_t dest_qpn, const QpOptions& o) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_4096;
  a.dest_qp_num = dest_qpn;
  a.ah_attr.is_global = 1;
  PeerGid(&a.ah_attr.grh.dgid);
  a.ah_attr.port_num = 1;
  a.max_dest_rd_atomic = 16;
  a.min_rnr_timer = o.min_rnr_timer;
  int mask = IBV_QP_STATE;
  if (o.type != IBV_QPT_UD) mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
  if (o.type == IBV_QPT_RC) mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  const int rc = ibv_modify_qp(qp, &a, mask);
  if (rc != 0) return rc;
  a = ibv_qp_attr{};
  a.qp_state = IBV_QPS_RTS;
  a.timeout = o.timeout;
  a.retry_cnt = o.retry_cnt;
  a.rnr_retry = o.rnr_retry;
  a.max_rd_atomic = o.max_rd_atomic;
  mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
  if (o.type == IBV_QPT_RC)
    mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
  return ibv_modify_qp(qp, &a, mask);
}

namespace {

// Posts one signalled work request of `op` on `sge`; `fill` sets what is particular to it.
template <typename Fill>
int PostOne(ibv_qp* qp, ibv_wr_opcode op, const ibv_sge& sge, uint64_t wr_id, Fill&& fill) {
  ibv_sge s = sge;
  ibv_send_wr wr{};
  wr.wr_id = wr_id;
  wr.opcode = op;
  wr.sg_list = &s;
  wr.num_sge = 1;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.imm_data = htonl(0xabcd);
  fill(&wr);
  ibv_send_wr* bad = nullptr;
  return ibv_post_send(qp, &wr, &bad);
}

}  // namespace

int PostSend(ibv_qp* qp, ibv_wr_opcode op, const ibv_sge& sge, uint64_t wr_id, uint64_t remote_addr,
             uint32_t rkey) {
  return PostOne(qp, op, sge, wr_id, [&](ibv_send_wr* wr) { wr->wr.rdma = {remote_addr, rkey}; });
}

int PostAtomic(ibv_qp* qp, ibv_wr_opcode op, const ibv_sge& sge, uint64_t wr_id,
               uint64_t remote_addr, uint32_t rkey, uint64_t compare_add, uint64_t swap) {
  return PostOne(qp, op, sge, wr_id, [&](ibv_send_wr* wr) {
    wr->wr.atomic = {remote_addr, compare_add, swap, rkey};
  });
}

int PostUdSend(ibv_qp* qp, ibv_ah* ah, const ibv_sge& sge, uint64_t wr_id, uint32_t remote_qpn,
               uint32_t qkey) {
  return PostOne(qp, IBV_WR_SEND, sge, wr_id, [&](ibv_send_wr* wr) {
    wr->wr.ud = {ah, remote_qpn, qkey};
  });
}

namespace {

// One receive of one SGE, posted by post(wr, bad).
template <typename Post>
int PostOneRecv(const ibv_sge& sge, uint64_t wr_id, Post&& post) {
  ibv_sge s = sge;
  ibv_recv_wr wr{};
  wr.wr_id = wr_id;
  wr.sg_list = &s;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  return post(&wr, &bad);
}

}  // namespace

int PostRecv(ibv_qp* qp, const ibv_sge& sge, uint64_t wr_id) {
  return PostOneRecv(
      sge, wr_id, [&](ibv_recv_wr* wr, ibv_recv_wr** bad) { return ibv_post_recv(qp, wr, bad); });
}

int PostSrqRecv(ibv_srq* srq, const ibv_sge& sge, uint64_t wr_id) {
  return PostOneRecv(sge, wr_id, [&](ibv_recv_wr* wr, ibv_recv_wr** bad) {
    return ibv_post_srq_recv(srq, wr, bad);
  });
}

std::vector<ibv_wc> PollN(ibv_cq* cq, size_t n) {
  std::vector<ibv_wc> got;
  const auto deadline = Clock::now() + kWaitLimit;
  while (got.size() < n && Clock::now() < deadline) {
    ibv_wc wc[16];
    const int k = ibv_poll_cq(cq, 16, wc);
    if (k < 0) {
      ADD_FAILURE() << "ibv_poll_cq: " << k;
      break;
    }
    got.insert(got.end(), wc, wc + k);
    if (k == 0) std::this_thread::yield();
  }
  return got;
}

std::vector<ibv_wc> PollFew(ibv_cq* cq, int times) {
  std::vector<ibv_wc> got;
  for (int i = 0; i < times; ++i) {
    ibv_wc wc[16];
    const int k = ibv_poll_cq(cq, 16, wc);
    if (k > 0) got.insert(got.end(), wc, wc + k);
  }
  return got;
}

void ExpectFailedThenFlushed(const std::vector<ibv_wc>& wcs, uint64_t failed, uint64_t flushed) {
  ASSERT_EQ(wcs.size(), 2u);
  EXPECT_EQ(wcs[0].wr_id, failed);
  EXPECT_EQ(wcs[0].status, IBV_WC_RETRY_EXC_ERR);
  EXPECT_EQ(wcs[1].wr_id, flushed);
  EXPECT_EQ(wcs[1].status, IBV_WC_WR_FLUSH_ERR);
}

ibv_qp_state StateOf(ibv_qp* qp) {
  ibv_qp_attr a{};
  ibv_qp_init_attr init{};
  EXPECT_EQ(ibv_query_qp(qp, &a, IBV_QP_STATE, &init), 0);
  return a.qp_state;
}

int NextAsyncEvent(ibv_context* ctx, ibv_async_event* out) {
  pollfd p{ctx->async_fd, POLLIN, 0};
  const int ms = static_cast<int>(std::chrono::milliseconds(kWaitLimit).count());
  if (::poll(&p, 1, ms) != 1) return -1;
  if (ibv_get_async_event(ctx, out) != 0) return -1;
  ibv_ack_async_event(out);
  return 0;
}

}  // namespace fftest
