// Readiness of streams through poll, select and epoll (level and edge triggered, one-shot),
// mixed with kernel descriptors, and sleeping until a bell.
#include <poll.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "stream_fixture.h"

namespace ff::fsocket::testing {
namespace {

using WaitTest = StreamPair;

TEST_F(WaitTest, PollSeesDataRoomAndEndOfFile) {
  pollfd p{server_, POLLIN | POLLOUT, 0};
  ASSERT_EQ(::poll(&p, 1, 0), 1);
  EXPECT_EQ(p.revents, POLLOUT);
  ASSERT_EQ(::write(client_, "x", 1), 1);
  ASSERT_EQ(::poll(&p, 1, 1000), 1);
  EXPECT_EQ(p.revents, POLLIN | POLLOUT);
  char c;
  ASSERT_EQ(::read(server_, &c, 1), 1);
  ASSERT_EQ(::shutdown(client_, SHUT_WR), 0);
  p.events = POLLIN | POLLRDHUP;
  ASSERT_EQ(::poll(&p, 1, 1000), 1);
  EXPECT_EQ(p.revents & (POLLIN | POLLRDHUP), POLLIN | POLLRDHUP);
}

TEST_F(WaitTest, PollSleepsUntilABellAndTimesOut) {
  pollfd p{server_, POLLIN, 0};
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(::poll(&p, 1, 50), 0);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(45));
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ASSERT_EQ(::write(client_, "x", 1), 1);
  });
  EXPECT_EQ(::poll(&p, 1, 5000), 1);
  EXPECT_EQ(p.revents, POLLIN);
  late.join();
}

TEST_F(WaitTest, PollMixesStreamsAndKernelDescriptors) {
  int pipefd[2];
  ASSERT_EQ(::pipe(pipefd), 0);
  pollfd p[2] = {{server_, POLLIN, 0}, {pipefd[0], POLLIN, 0}};
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ASSERT_EQ(::write(pipefd[1], "k", 1), 1);
  });
  ASSERT_EQ(::poll(p, 2, 5000), 1);
  EXPECT_EQ(p[0].revents, 0);
  EXPECT_EQ(p[1].revents, POLLIN);
  late.join();
  ::close(pipefd[0]);
  ::close(pipefd[1]);
}

TEST_F(WaitTest, SelectSeesStreams) {
  fd_set r, w;
  FD_ZERO(&r);
  FD_ZERO(&w);
  FD_SET(server_, &r);
  FD_SET(server_, &w);
  timeval tv{1, 0};
  ASSERT_EQ(::select(server_ + 1, &r, &w, nullptr, &tv), 1);
  EXPECT_FALSE(FD_ISSET(server_, &r));
  EXPECT_TRUE(FD_ISSET(server_, &w));
  ASSERT_EQ(::write(client_, "x", 1), 1);
  FD_ZERO(&r);
  FD_SET(server_, &r);
  tv = {1, 0};
  ASSERT_EQ(::select(server_ + 1, &r, nullptr, nullptr, &tv), 1);
  EXPECT_TRUE(FD_ISSET(server_, &r));
}

TEST_F(WaitTest, EpollLevelTriggeredReportsUntilRead) {
  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  ASSERT_GE(ep, 0);
  epoll_event ev{EPOLLIN, {}};
  ev.data.u64 = 42;
  ASSERT_EQ(::epoll_ctl(ep, EPOLL_CTL_ADD, server_, &ev), 0);
  epoll_event out[4];
  EXPECT_EQ(::epoll_wait(ep, out, 4, 0), 0);
  ASSERT_EQ(::write(client_, "xy", 2), 2);
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(::epoll_wait(ep, out, 4, 1000), 1);
    EXPECT_EQ(out[0].events, static_cast<uint32_t>(EPOLLIN));
    EXPECT_EQ(out[0].data.u64, 42u);
  }
  char buf[2];
  ASSERT_EQ(::read(server_, buf, 2), 2);
  EXPECT_EQ(::epoll_wait(ep, out, 4, 0), 0);
  ::close(ep);
}

TEST_F(WaitTest, EpollEdgeTriggeredReportsEachArrivalOnce) {
  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev{EPOLLIN | EPOLLET, {}};
  ev.data.fd = server_;
  ASSERT_EQ(::epoll_ctl(ep, EPOLL_CTL_ADD, server_, &ev), 0);
  epoll_event out[4];
  ASSERT_EQ(::write(client_, "a", 1), 1);
  ASSERT_EQ(::epoll_wait(ep, out, 4, 1000), 1);
  EXPECT_EQ(::epoll_wait(ep, out, 4, 0), 0) << "no new edge";
  ASSERT_EQ(::write(client_, "b", 1), 1);
  EXPECT_EQ(::epoll_wait(ep, out, 4, 1000), 1) << "new bytes are a new edge";
  ::close(ep);
}

TEST_F(WaitTest, EpollOneShotNeedsRearming) {
  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev{EPOLLIN | EPOLLONESHOT, {}};
  ASSERT_EQ(::epoll_ctl(ep, EPOLL_CTL_ADD, server_, &ev), 0);
  ASSERT_EQ(::write(client_, "a", 1), 1);
  epoll_event out[4];
  ASSERT_EQ(::epoll_wait(ep, out, 4, 1000), 1);
  EXPECT_EQ(::epoll_wait(ep, out, 4, 0), 0);
  ASSERT_EQ(::epoll_ctl(ep, EPOLL_CTL_MOD, server_, &ev), 0);
  EXPECT_EQ(::epoll_wait(ep, out, 4, 0), 1);
  ::close(ep);
}

// A stream that slept in epoll_wait, then got data and the bell behind it (on `bell_at`: its
// bell, or the kernel socket for a stream without one): one event, and the bell taken.
void EpollReportsOnce(int server, int client, int bell_at) {
  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev{EPOLLIN, {}};
  ASSERT_EQ(::epoll_ctl(ep, EPOLL_CTL_ADD, server, &ev), 0);
  epoll_event out[4];
  EXPECT_EQ(::epoll_wait(ep, out, 4, 1), 0);  // slept: the stream asked for a bell
  ASSERT_EQ(::write(client, "x", 1), 1);      // data, and the bell behind it
  pollfd p{bell_at, POLLIN, 0};
  ASSERT_EQ(real::poll(&p, 1, 1000), 1) << "the bell did not reach descriptor " << bell_at;
  EXPECT_EQ(::epoll_wait(ep, out, 4, 1000), 1) << "one event for one descriptor";
  EXPECT_EQ(real::poll(&p, 1, 0), 0) << "the wait took the bell";
  ::close(ep);
}

TEST_F(WaitTest, EpollReportsAStreamOnceWhenItsBellCameToo) {
  EpollReportsOnce(server_, client_, bell_[ff::proto::kStreamServer].get());
  EXPECT_EQ(KernelBytes(server_), 0) << "a bell went over the kernel connection";
}

// The same without bells (a process over its budget of them): the kernel connection rings.
class KernelBellWaitTest : public StreamPair {
 protected:
  KernelBellWaitTest() { bells_ = false; }
};

TEST_F(KernelBellWaitTest, EpollReportsAStreamOnceWhenItsBellCameToo) {
  EpollReportsOnce(server_, client_, server_);
}

TEST_F(WaitTest, EpollSleepsUntilABell) {
  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev{EPOLLIN, {}};
  ev.data.u64 = 7;
  ASSERT_EQ(::epoll_ctl(ep, EPOLL_CTL_ADD, server_, &ev), 0);
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ASSERT_EQ(::write(client_, "x", 1), 1);
  });
  epoll_event out[4];
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(::epoll_wait(ep, out, 4, 5000), 1);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(90));
  const uint64_t data = out[0].data.u64;  // epoll_event is packed
  EXPECT_EQ(data, 7u) << "the bell's own registration never reaches the program";
  late.join();
  ::close(ep);
}

TEST_F(WaitTest, EpollSeesThePeersCloseAfterItsLastBytes) {
  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev{EPOLLIN | EPOLLRDHUP, {}};
  ASSERT_EQ(::epoll_ctl(ep, EPOLL_CTL_ADD, server_, &ev), 0);
  ASSERT_EQ(::write(client_, "ab", 2), 2);
  ASSERT_EQ(::close(client_), 0);
  client_ = -1;
  epoll_event out[4];
  ASSERT_EQ(::epoll_wait(ep, out, 4, 1000), 1);
  char buf[4];
  EXPECT_EQ(::read(server_, buf, sizeof(buf)), 2);
  uint32_t seen = 0;
  for (int i = 0; i < 100 && !(seen & EPOLLRDHUP); ++i) {
    if (::epoll_wait(ep, out, 4, 100) == 1) seen = out[0].events;
  }
  EXPECT_EQ(seen & (EPOLLIN | EPOLLRDHUP), static_cast<uint32_t>(EPOLLIN | EPOLLRDHUP));
  EXPECT_EQ(::read(server_, buf, sizeof(buf)), 0);
  ::close(ep);
}

// An event loop reads until EAGAIN and then waits; the read that finds the ring empty just
// after the library found the kernel connection empty does not look at it again
// (kKernelQuietNs). A FIN that comes then is still the edge the next wait reports.
TEST_F(WaitTest, AnEdgeTriggeredWaitSeesACloseThatCameAfterAnEmptyRead) {
  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev{EPOLLIN | EPOLLRDHUP | EPOLLET, {}};
  ASSERT_EQ(::epoll_ctl(ep, EPOLL_CTL_ADD, server_, &ev), 0);
  ASSERT_EQ(::write(client_, "ab", 2), 2);
  epoll_event out[4];
  ASSERT_EQ(::epoll_wait(ep, out, 4, 1000), 1);
  char buf[4];
  EXPECT_EQ(::recv(server_, buf, sizeof(buf), MSG_DONTWAIT), 2);
  EXPECT_EQ(::recv(server_, buf, sizeof(buf), MSG_DONTWAIT), -1);
  EXPECT_EQ(errno, EAGAIN);
  ASSERT_EQ(::close(client_), 0);
  client_ = -1;
  const ssize_t early = ::recv(server_, buf, sizeof(buf), MSG_DONTWAIT);
  EXPECT_TRUE(early == 0 || (early == -1 && errno == EAGAIN)) << early;
  if (early == -1) {
    ASSERT_EQ(::epoll_wait(ep, out, 4, 1000), 1) << "the FIN's edge was lost";
    EXPECT_EQ(out[0].events & (EPOLLIN | EPOLLRDHUP), static_cast<uint32_t>(EPOLLIN | EPOLLRDHUP));
    EXPECT_EQ(::recv(server_, buf, sizeof(buf), MSG_DONTWAIT), 0);
  }
  ::close(ep);
}

// A program that reads in a loop and never waits learns of the peer's close soon after.
TEST_F(WaitTest, ANonBlockingReaderThatNeverWaitsSeesACloseSoon) {
  char buf[4];
  EXPECT_EQ(::recv(server_, buf, sizeof(buf), MSG_DONTWAIT), -1);  // the kernel: empty
  ASSERT_EQ(::close(client_), 0);
  client_ = -1;
  const auto t0 = std::chrono::steady_clock::now();
  ssize_t rc = -1;
  for (int i = 0; i < 20'000'000 && rc != 0; ++i) {
    rc = ::recv(server_, buf, sizeof(buf), MSG_DONTWAIT);
    if (rc != 0) {
      ASSERT_EQ(errno, EAGAIN);
    }
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(2)) break;
  }
  EXPECT_EQ(rc, 0) << "no end of file in 2 s of reads";
}

}  // namespace
}  // namespace ff::fsocket::testing
