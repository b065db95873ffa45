// What an epoll set keeps of a descriptor the program closes without EPOLL_CTL_DEL (as
// nginx does with every connection): the stream is given up at the close, a number that
// comes back is a new registration, and a bell whose other side is closed does not wake
// waits over and over.
#include <fcntl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "bells.h"
#include "epoll.h"
#include "stream_fixture.h"

namespace ff::fsocket::testing {
namespace {

using EpollCloseTest = StreamPair;

uint64_t ThreadCpuNs() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec * 1'000'000'000ull + t.tv_nsec;
}

// One byte written to `fd` `ms` milliseconds from now (the caller joins the thread).
std::thread WriteLater(int fd, int ms) {
  return std::thread([fd, ms] {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    ASSERT_EQ(::write(fd, "x", 1), 1);
  });
}

// epoll_wait that must report exactly `fd`'s registration (data `data`) with EPOLLIN.
void ReportsOnly(int ep, uint64_t data) {
  epoll_event out[4];
  ASSERT_EQ(::epoll_wait(ep, out, 4, 2000), 1);
  const uint64_t got = out[0].data.u64;  // epoll_event is packed
  EXPECT_EQ(got, data);
  EXPECT_TRUE(out[0].events & EPOLLIN);
}

TEST_F(EpollCloseTest, AClosedStreamIsGivenUpThoughItsSetStillHadIt) {
  const int held = BellFdsHeld();
  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev{EPOLLIN | EPOLLET, {}};
  ASSERT_EQ(::epoll_ctl(ep, EPOLL_CTL_ADD, server_, &ev), 0);
  ASSERT_EQ(::close(server_), 0);  // no EPOLL_CTL_DEL first
  server_ = -1;
  EXPECT_EQ(BellFdsHeld(), held - 1) << "the set's watch kept the closed stream alive";
  // Its peer's bytes wake nobody: the set has nothing left.
  ASSERT_EQ(::write(client_, "x", 1), 1);
  epoll_event out[2];
  EXPECT_EQ(::epoll_wait(ep, out, 2, 100), 0);
  ::close(ep);
}

TEST_F(EpollCloseTest, Dup2OverAWatchedStreamGivesItUpAsCloseWould) {
  const int held = BellFdsHeld();
  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev{EPOLLIN, {}};
  ASSERT_EQ(::epoll_ctl(ep, EPOLL_CTL_ADD, server_, &ev), 0);
  const int plain = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(plain, 0);
  ASSERT_EQ(::dup2(plain, server_), server_);
  EXPECT_EQ(BellFdsHeld(), held - 1);
  EXPECT_FALSE(Lookup(server_));
  ev.data.u64 = 9;  // the number is the program's new socket, registered anew
  EXPECT_EQ(::epoll_ctl(ep, EPOLL_CTL_ADD, server_, &ev), 0);
  ::close(plain);
  ::close(ep);
}

TEST_F(EpollCloseTest, ADupKeepsTheStreamWhenOneNumberCloses) {
  const int held = BellFdsHeld();
  const int copy = ::dup(server_);
  ASSERT_GE(copy, 0);
  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev{EPOLLIN, {}};
  ev.data.u64 = 5;
  ASSERT_EQ(::epoll_ctl(ep, EPOLL_CTL_ADD, server_, &ev), 0);
  ev.data.u64 = 6;
  ASSERT_EQ(::epoll_ctl(ep, EPOLL_CTL_ADD, copy, &ev), 0);
  ASSERT_EQ(::close(server_), 0);
  server_ = copy;
  EXPECT_EQ(BellFdsHeld(), held);
  // The copy's watch still sleeps on the one bell both registrations shared.
  std::thread late = WriteLater(client_, 100);
  ReportsOnly(ep, 6);
  late.join();
  ::close(ep);
}

// nginx's sequence: a plain descriptor watched and closed without DEL; a connection
// accepted at the same number becomes a stream before the program registers it. The old
// watch is stale: the stream must not be registered under it (its bell was, and its
// memory was freed while the kernel still reported that bell: a crash under load).
TEST_F(EpollCloseTest, ANumberThatComesBackAsAStreamIsANewRegistration) {
  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  const int plain = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(plain, 0);
  epoll_event ev{EPOLLIN | EPOLLRDHUP | EPOLLET, {}};
  ev.data.u64 = 1;
  ASSERT_EQ(::epoll_ctl(ep, EPOLL_CTL_ADD, plain, &ev), 0);
  ASSERT_EQ(::close(plain), 0);
  const int again = ::dup(server_);  // the lowest free number: the one just closed
  ASSERT_EQ(again, plain);
  Ref s = Lookup(again);
  ASSERT_TRUE(s);
  EpollStreamCreated(again, s.get());  // as accept does
  ev.data.u64 = 2;
  ASSERT_EQ(::epoll_ctl(ep, EPOLL_CTL_ADD, again, &ev), 0);
  for (int round = 0; round < 3; ++round) {
    std::thread late = WriteLater(client_, 50);
    ReportsOnly(ep, 2);
    char c;
    EXPECT_EQ(::read(again, &c, 1), 1);
    late.join();
  }
  ::close(again);
  ::close(ep);
}

// Without the close interposed (fclose, a raw system call) the watch outlives its
// descriptor; the kernel's answer to the next ADD of the number shows it stale.
TEST_F(EpollCloseTest, AWatchWhoseCloseWasNotSeenIsReplaced) {
  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  const int plain = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(plain, 0);
  epoll_event ev{EPOLLIN, {}};
  ev.data.u64 = 3;
  ASSERT_EQ(::epoll_ctl(ep, EPOLL_CTL_ADD, plain, &ev), 0);
  ASSERT_EQ(real::close(plain), 0);  // unseen: the watch stays
  ASSERT_EQ(real::dup2(server_, plain), plain);
  Ref s = Lookup(server_);
  Ref none = Install(plain, s.get());  // as dup2 does, without its look at the old number
  ev.data.u64 = 4;
  ASSERT_EQ(::epoll_ctl(ep, EPOLL_CTL_ADD, plain, &ev), 0);
  ASSERT_EQ(::write(client_, "x", 1), 1);
  ReportsOnly(ep, 4);
  ::close(plain);
  ::close(ep);
}

// gRPC's registration: EPOLLIN | EPOLLOUT | EPOLLET, no EPOLLRDHUP. The peer's close after
// bytes already reported is a new EPOLLIN edge, as the kernel's FIN is; without it the
// server kept every connection its clients had closed.
TEST_F(EpollCloseTest, ThePeersCloseIsAnEdgeWithoutRdhupAsked) {
  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev{EPOLLIN | EPOLLOUT | EPOLLET, {}};
  ASSERT_EQ(::epoll_ctl(ep, EPOLL_CTL_ADD, server_, &ev), 0);
  ASSERT_EQ(::write(client_, "ab", 2), 2);
  epoll_event out[2];
  ASSERT_EQ(::epoll_wait(ep, out, 2, 1000), 1);
  char c[2];
  ASSERT_EQ(::read(server_, c, 2), 2);  // what was reported, and no look for more
  ASSERT_EQ(::close(client_), 0);
  client_ = -1;
  uint32_t seen = 0;
  for (int i = 0; i < 20 && !(seen & EPOLLIN); ++i)
    if (::epoll_wait(ep, out, 2, 100) == 1) seen = out[0].events;
  EXPECT_TRUE(seen & EPOLLIN) << "the peer's close woke nobody";
  EXPECT_FALSE(seen & EPOLLRDHUP) << "not asked for";
  EXPECT_EQ(::read(server_, c, 2), 0);
  ::close(ep);
}

// gRPC's server: one thread sleeps in epoll_wait on a set without streams (its listener
// only) while another accepts a connection and adds it. The sleeper must learn of the
// stream's bytes now, not when its own timeout ends.
TEST_F(EpollCloseTest, AStreamAddedWhileAThreadSleepsOnTheSetWakesIt) {
  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  const int plain = ::eventfd(0, EFD_CLOEXEC);  // the set's other member, never ready
  epoll_event ev{EPOLLIN, {}};
  ev.data.u64 = 1;
  ASSERT_EQ(::epoll_ctl(ep, EPOLL_CTL_ADD, plain, &ev), 0);
  int got = -1;
  uint64_t data = 0;
  std::chrono::steady_clock::duration took{};
  std::thread sleeper([&] {
    epoll_event out[2];
    const auto t0 = std::chrono::steady_clock::now();
    got = ::epoll_wait(ep, out, 2, 8000);
    took = std::chrono::steady_clock::now() - t0;
    data = out[0].data.u64;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // asleep in the kernel
  ev.data.u64 = 2;
  ev.events = EPOLLIN | EPOLLOUT | EPOLLET;
  ASSERT_EQ(::epoll_ctl(ep, EPOLL_CTL_ADD, server_, &ev), 0);
  sleeper.join();
  EXPECT_EQ(got, 1);
  EXPECT_EQ(data, 2u) << "the kick itself reached the program";
  EXPECT_LT(took, std::chrono::seconds(2));
  // And its bytes reach a wait that slept before they came.
  std::thread late = WriteLater(client_, 100);
  ReportsOnly(ep, 2);
  late.join();
  ::close(plain);
  ::close(ep);
}

// Bytes that land while a wait computes a stream's report are reported, now or at the next
// look, never remembered as seen without a report. gRPC's pattern: a server registered for
// EPOLLIN | EPOLLOUT | EPOLLET answers each request; the client takes the answer (room: an
// EPOLLOUT edge) and sends the next request at once. The old report read the ring twice and
// could report the room alone while remembering the request as seen: the server slept
// through it (50 ms, the cap of a stream wait's sleep, a few times a second for gRPC). Here
// the server looks without sleeping, so that the request often lands during a look.
TEST_F(EpollCloseTest, ARequestPutDuringAReportIsNeverLost) {
  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev{EPOLLIN | EPOLLOUT | EPOLLET, {}};
  ASSERT_EQ(::epoll_ctl(ep, EPOLL_CTL_ADD, server_, &ev), 0);
  constexpr int kRequests = 20000;
  std::atomic<int> answered{0};
  std::atomic<bool> done{false};
  std::thread server([&] {
    while (!done.load()) {
      epoll_event out[2];
      const int n = ::epoll_wait(ep, out, 2, 0);
      if (n != 1 || !(out[0].events & EPOLLIN)) continue;
      char c[16];
      while (::recv(server_, c, sizeof(c), MSG_DONTWAIT) > 0) {
        ASSERT_EQ(::send(server_, "a", 1, 0), 1);
        answered.fetch_add(1);
      }
    }
  });
  int lost = 0;
  char a;
  for (int i = 0; i < kRequests && lost == 0; ++i) {
    ASSERT_EQ(::write(client_, "q", 1), 1);
    const auto t0 = std::chrono::steady_clock::now();
    while (answered.load() <= i) {
      if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(1)) {
        lost = i + 1;
        break;
      }
    }
    if (lost != 0) break;
    ASSERT_EQ(::read(client_, &a, 1), 1);  // the room: an EPOLLOUT edge
  }
  done = true;
  server.join();
  EXPECT_EQ(lost, 0) << "request " << lost << " was in the ring and never reported";
  ::close(ep);
}

// The peer is gone, its bell side with it: a wait for news that will not come sleeps.
TEST_F(EpollCloseTest, ABellWhoseOtherSideClosedDoesNotKeepWakingTheWait) {
  const int ep = ::epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev{EPOLLIN | EPOLLRDHUP | EPOLLET, {}};
  ASSERT_EQ(::epoll_ctl(ep, EPOLL_CTL_ADD, server_, &ev), 0);
  ASSERT_EQ(::close(client_), 0);
  client_ = -1;
  bell_[ff::proto::kStreamClient].reset();  // the fixture's copy of the peer's side
  epoll_event out[2];
  ASSERT_EQ(::epoll_wait(ep, out, 2, 1000), 1);
  char c;
  EXPECT_EQ(::read(server_, &c, 1), 0);
  const uint64_t cpu0 = ThreadCpuNs();
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(::epoll_wait(ep, out, 2, 300), 0) << "the edge was reported once";
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(290));
  EXPECT_LT(ThreadCpuNs() - cpu0, 100'000'000u) << "the wait spun on the hung-up bell";
  Ref s = Lookup(server_);
  EXPECT_EQ(WaitableBell(*s), -1);
  EXPECT_EQ(ArmValue(*s), ff::kArmKernel);
  ::close(ep);
}

}  // namespace
}  // namespace ff::fsocket::testing
