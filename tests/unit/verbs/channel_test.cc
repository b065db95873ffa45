// Completion channels: the fd the application sleeps on is the receiving end of a wake
// socket the library owns; the router and same-node peers hold only its sending end, and
// nothing they do to that end can make the library's own wake-ups block.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "pod.h"

namespace fftest {
namespace {

using std::chrono::milliseconds;

// Bounds a call that must not block: after `after`, interrupts the thread that made the
// watchdog with SIGUSR2 (handled without SA_RESTART, so a blocked send returns EINTR) every
// 100 ms until Stop(), at most 50 times. Stop() tells whether it had to.
class Watchdog {
 public:
  explicit Watchdog(milliseconds after) : target_(::pthread_self()) {
    struct sigaction sa {};
    sa.sa_handler = [](int) {};
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGUSR2, &sa, &old_);
    thread_ = std::thread([this, after] {
      std::unique_lock<std::mutex> l(mu_);
      if (cv_.wait_for(l, after, [this] { return done_; })) return;
      for (int i = 0; i < 50 && !done_; ++i) {
        fired_ = true;
        ::pthread_kill(target_, SIGUSR2);
        cv_.wait_for(l, milliseconds(100), [this] { return done_; });
      }
    });
  }
  ~Watchdog() { Stop(); }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  bool Stop() {
    {
      std::lock_guard<std::mutex> g(mu_);
      done_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) {
      thread_.join();
      ::sigaction(SIGUSR2, &old_, nullptr);
    }
    return fired_;
  }

 private:
  pthread_t target_;
  struct sigaction old_ {};
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  bool fired_ = false;
  std::thread thread_;
};

ino_t InodeOf(int fd) {
  struct stat st {};
  EXPECT_EQ(::fstat(fd, &st), 0);
  return st.st_ino;
}

TEST(Channels, TheChannelFdIsTheLibrarysEndOfAWakeSocketTheRouterSendsOn) {
  Pod pod;
  ibv_comp_channel* ch = pod.NewChannel();
  ASSERT_NE(ch, nullptr);
  const int tx = pod.router.last_channel_fd();
  ASSERT_GE(tx, 0) << "the router was given no fd for the channel";
  EXPECT_TRUE(ff::IsWakeSocket(ch->fd));
  EXPECT_TRUE(ff::IsWakeSocket(tx));
  EXPECT_NE(InodeOf(ch->fd), InodeOf(tx)) << "the router holds the application's own end";
  pollfd p{ch->fd, POLLIN, 0};
  EXPECT_EQ(::poll(&p, 1, 0), 0);
  ff::SendWake(tx);
  EXPECT_EQ(::poll(&p, 1, 1000), 1);
  EXPECT_EQ(ff::DrainWakes(ch->fd), 1);
}

// The router's end shares its open file description with the library's own sending end:
// clearing O_NONBLOCK on it and filling the socket is what a hostile holder would do to make
// the library's next wake-up (WakeCq, under the context lock) block forever.
TEST(Channels, ABlockingFullSocketNeverBlocksTheLibrarysWakeUp) {
  Pod pod;
  ibv_comp_channel* ch = pod.NewChannel();
  ASSERT_NE(ch, nullptr);
  ibv_cq* cq = pod.NewCq(16, ch);
  ASSERT_NE(cq, nullptr);
  SameNodePeer peer(0x500, IBV_QPT_RC, 4096);
  QpOptions o;
  o.send_cq = cq;
  ibv_qp* qp = pod.CreateQp(o);
  ASSERT_NE(qp, nullptr);
  pod.router.AnswerSameNode(qp->qp_num, &peer);
  ASSERT_EQ(pod.Connect(qp, 0x500, o), 0);

  const int tx = pod.router.last_channel_fd();
  ASSERT_GE(tx, 0);
  ASSERT_EQ(::fcntl(tx, F_SETFL, 0), 0);
  int queued = 0;
  for (; queued < 100000; ++queued) {
    const char one = 1;
    if (::send(tx, &one, 1, MSG_DONTWAIT) != 1) break;
  }
  ASSERT_EQ(errno, EAGAIN) << "the socket never filled";
  ASSERT_GT(queued, 0);
  ASSERT_EQ(::fcntl(ch->fd, F_SETFL, O_NONBLOCK), 0);  // get_cq_event below must not wait

  ASSERT_EQ(ibv_req_notify_cq(cq, 0), 0);
  peer.PostCredits(1);
  Buffer buf(pod.pd, 8);
  Watchdog watchdog(milliseconds(1000));
  const auto start = Clock::now();
  ASSERT_EQ(PostSend(qp, IBV_WR_SEND, buf.Sge(0, 8), 1), 0);
  const std::vector<ibv_wc> wcs = PollN(cq, 1);
  const auto took = Clock::now() - start;
  EXPECT_FALSE(watchdog.Stop()) << "the wake-up blocked on the full socket";
  EXPECT_LT(took, milliseconds(500));
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);

  // The event still fires: the application sleeping on the channel learns of the CQ.
  ibv_cq* fired = nullptr;
  void* cq_context = nullptr;
  ASSERT_EQ(ibv_get_cq_event(ch, &fired, &cq_context), 0);
  EXPECT_EQ(fired, cq);
  ibv_ack_cq_events(cq, 1);

  // Drained, the socket carries wake-ups again.
  EXPECT_GT(ff::DrainWakes(ch->fd), 0);
  ASSERT_EQ(ibv_req_notify_cq(cq, 0), 0);
  peer.PostCredits(1);
  ASSERT_EQ(PostSend(qp, IBV_WR_SEND, buf.Sge(0, 8), 2), 0);
  ASSERT_EQ(PollN(cq, 1).size(), 1u);
  pollfd p{ch->fd, POLLIN, 0};
  EXPECT_EQ(::poll(&p, 1, 1000), 1);
  ASSERT_EQ(ibv_get_cq_event(ch, &fired, &cq_context), 0);
  EXPECT_EQ(fired, cq);
  ibv_ack_cq_events(cq, 1);
}

}  // namespace
}  // namespace fftest
