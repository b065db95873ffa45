// The stream data path (fsocket/src/stream.cc) through the program's own calls: bytes,
// flags, blocking and waking, the end of a connection, and a hostile peer.
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/sendfile.h>
#include <sys/uio.h>
#include <sys/wait.h>

#include <chrono>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "stream_fixture.h"

namespace ff::fsocket::testing {
namespace {


using StreamTest = StreamPair;

TEST_F(StreamTest, BytesGoThroughTheSegmentBothWays) {
  const auto a = Pattern(1000, 1), b = Pattern(3000, 2);
  ASSERT_EQ(::write(client_, a.data(), a.size()), 1000);
  ASSERT_EQ(::send(server_, b.data(), b.size(), 0), 3000);
  EXPECT_EQ(ReadAll(server_, 1000), a);
  EXPECT_EQ(ReadAll(client_, 3000), b);
  EXPECT_GE(KernelBytes(server_), 0) << "a data byte reached the kernel connection";
  EXPECT_GE(KernelBytes(client_), 0);
}

TEST_F(StreamTest, ManyMegabytesAcrossThreadsArriveInOrder) {
  const auto data = Pattern(8 << 20, 3);  // 128 laps of the ring
  std::thread writer([&] {
    size_t off = 0;
    while (off < data.size()) {
      const ssize_t n =
          ::write(client_, data.data() + off, std::min<size_t>(100'000, data.size() - off));
      ASSERT_GT(n, 0);
      off += n;
    }
  });
  EXPECT_EQ(ReadAll(server_, data.size()), data);
  writer.join();
}

TEST_F(StreamTest, ABlockedReaderWakesWhenDataComesLater) {
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // past the spin: it sleeps
    ASSERT_EQ(::write(client_, "late", 4), 4);
  });
  char buf[8] = {};
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(::read(server_, buf, sizeof(buf)), 4);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(90));
  EXPECT_STREQ(buf, "late");
  late.join();
}

TEST_F(StreamTest, AFullRingBlocksTheWriterUntilTheReaderMakesRoom) {
  const auto data = Pattern(ring_bytes_ * 3, 4);
  std::atomic<bool> done{false};
  std::thread writer([&] {
    ASSERT_EQ(::write(client_, data.data(), data.size()), static_cast<ssize_t>(data.size()));
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(done.load()) << "three rings' worth cannot fit in one";
  EXPECT_EQ(ReadAll(server_, data.size()), data);
  writer.join();
}

TEST_F(StreamTest, NonBlockingSocketsGetEagainAndPartialWrites) {
  ASSERT_EQ(::fcntl(client_, F_SETFL, O_NONBLOCK), 0);
  char c;
  EXPECT_EQ(::read(client_, &c, 1), -1);
  EXPECT_EQ(errno, EAGAIN);
  const auto data = Pattern(ring_bytes_ + 100, 5);
  EXPECT_EQ(::write(client_, data.data(), data.size()), static_cast<ssize_t>(ring_bytes_));
  EXPECT_EQ(::write(client_, data.data(), 1), -1);
  EXPECT_EQ(errno, EAGAIN);
  EXPECT_EQ(::recv(server_, &c, 1, MSG_DONTWAIT), 1);
  EXPECT_EQ(c, static_cast<char>(data[0]));
}

TEST_F(StreamTest, PeekWaitallTruncAndFionread) {
  ASSERT_EQ(::write(client_, "abcdef", 6), 6);
  int avail = -1;
  while (avail != 6) ASSERT_EQ(::ioctl(server_, FIONREAD, &avail), 0);
  char buf[16] = {};
  EXPECT_EQ(::recv(server_, buf, 3, MSG_PEEK), 3);
  EXPECT_STREQ(buf, "abc");
  EXPECT_EQ(::recv(server_, nullptr, 2, MSG_TRUNC), 2);  // discarded
  std::thread more([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ASSERT_EQ(::write(client_, "gh", 2), 2);
  });
  std::memset(buf, 0, sizeof(buf));
  EXPECT_EQ(::recv(server_, buf, 6, MSG_WAITALL), 6);
  EXPECT_STREQ(buf, "cdefgh");
  more.join();
}

TEST_F(StreamTest, VectorsCrossTheRingsWrap) {
  const auto fill = Pattern(ring_bytes_ - 10, 6);
  ASSERT_EQ(::write(client_, fill.data(), fill.size()), static_cast<ssize_t>(fill.size()));
  EXPECT_EQ(ReadAll(server_, fill.size()), fill);
  const auto x = Pattern(7, 7), y = Pattern(20, 8);
  iovec out[2] = {{const_cast<uint8_t*>(x.data()), x.size()},
                  {const_cast<uint8_t*>(y.data()), y.size()}};
  ASSERT_EQ(::writev(client_, out, 2), 27);
  std::vector<uint8_t> p(5), q(22);
  iovec in[2] = {{p.data(), p.size()}, {q.data(), q.size()}};
  msghdr m{};
  m.msg_iov = in;
  m.msg_iovlen = 2;
  ASSERT_EQ(::recvmsg(server_, &m, MSG_WAITALL), 27);
  std::vector<uint8_t> got(p);
  got.insert(got.end(), q.begin(), q.end());
  std::vector<uint8_t> want(x);
  want.insert(want.end(), y.begin(), y.end());
  EXPECT_EQ(got, want);
}

TEST_F(StreamTest, HalfCloseDeliversEverythingThenEndOfFile) {
  ASSERT_EQ(::write(client_, "last words", 10), 10);
  ASSERT_EQ(::shutdown(client_, SHUT_WR), 0);
  char buf[32] = {};
  EXPECT_EQ(::recv(server_, buf, sizeof(buf), MSG_WAITALL), 10);
  EXPECT_STREQ(buf, "last words");
  EXPECT_EQ(::read(server_, buf, sizeof(buf)), 0);
  // The other direction still works after a half-close.
  ASSERT_EQ(::write(server_, "reply", 5), 5);
  EXPECT_EQ(::read(client_, buf, sizeof(buf)), 5);
  EXPECT_EQ(::send(client_, "x", 1, MSG_NOSIGNAL), -1);
  EXPECT_EQ(errno, EPIPE);
}

TEST_F(StreamTest, ClosingGivesTheDataThenEndOfFileAndLaterWritesFail) {
  ASSERT_EQ(::write(server_, "bye", 3), 3);
  ASSERT_EQ(::close(server_), 0);
  server_ = -1;
  char buf[8] = {};
  EXPECT_EQ(::read(client_, buf, sizeof(buf)), 3);
  EXPECT_EQ(::read(client_, buf, sizeof(buf)), 0);
  // As on TCP: a write after the peer closed may succeed once; then the reset makes it fail.
  int rc = 0;
  for (int i = 0; i < 100 && rc >= 0; ++i) {
    rc = static_cast<int>(::send(client_, "x", 1, MSG_NOSIGNAL));
    if (rc >= 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(rc, -1);
  EXPECT_TRUE(errno == EPIPE || errno == ECONNRESET) << strerror(errno);
}

TEST_F(StreamTest, APeerThatBreaksTheRingIndicesResetsOnlyThatConnection) {
  View();
  RingOf(0)->tail.store(RingOf(0)->head.load() + ring_bytes_ + 1);  // more than a ring holds
  char buf[8];
  EXPECT_EQ(::read(server_, buf, sizeof(buf)), -1);
  EXPECT_EQ(errno, ECONNRESET);
  EXPECT_EQ(::read(server_, buf, sizeof(buf)), 0);
}

TEST_F(StreamTest, BytesOutsideTheSegmentResetTheConnection) {
  ASSERT_EQ(real::send(client_, "GET /", 5, 0), 5);  // past the library: a forged byte
  char buf[8];
  pollfd p{server_, POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 2000), 1);
  EXPECT_EQ(::read(server_, buf, sizeof(buf)), -1);
  EXPECT_EQ(errno, ECONNRESET);
}

TEST_F(StreamTest, AForkedChildKeepsTheConnection) {
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    char buf[5] = {};
    const bool ok = ::recv(server_, buf, 4, MSG_WAITALL) == 4 && std::strcmp(buf, "ping") == 0 &&
                    ::write(server_, "pong", 4) == 4;
    ::_exit(ok ? 0 : 1);
  }
  ASSERT_EQ(::write(client_, "ping", 4), 4);
  char buf[5] = {};
  EXPECT_EQ(::recv(client_, buf, 4, MSG_WAITALL), 4);
  EXPECT_STREQ(buf, "pong");
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

TEST_F(StreamTest, ADuplicateWorksAndOutlivesTheOriginal) {
  const int copy = ::dup(server_);
  ASSERT_GE(copy, 0);
  ASSERT_EQ(::close(server_), 0);
  server_ = copy;
  ASSERT_EQ(::write(client_, "dup", 3), 3);
  char buf[4] = {};
  EXPECT_EQ(::recv(server_, buf, 3, MSG_WAITALL), 3);
  EXPECT_STREQ(buf, "dup");
}

// The kernel connection of a stream keeps TCP_NODELAY on: a bell held back by Nagle's
// algorithm until the ACK of the one before (the peer's delayed ACK: up to 40 ms) halved
// iperf3 between two pods. The program still sees and sets its own value.
TEST_F(StreamTest, BellsBypassNagleWhileTheProgramSeesItsOwnNodelay) {
  auto kernel = [](int fd) {
    int v = -1;
    socklen_t len = sizeof(v);
    EXPECT_EQ(real::getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &v, &len), 0);
    return v;
  };
  auto seen = [](int fd) {
    int v = -1;
    socklen_t len = sizeof(v);
    EXPECT_EQ(::getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &v, &len), 0);
    EXPECT_EQ(len, sizeof(int));
    return v;
  };
  for (int fd : {client_, server_}) {
    EXPECT_EQ(kernel(fd), 1);
    EXPECT_EQ(seen(fd), 0) << "the program never set it";
    const int on = 1, off = 0;
    ASSERT_EQ(::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on)), 0);
    EXPECT_EQ(seen(fd), 1);
    ASSERT_EQ(::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &off, sizeof(off)), 0);
    EXPECT_EQ(seen(fd), 0);
    EXPECT_EQ(kernel(fd), 1) << "the program turned Nagle back on for the bells";
  }
  // Other options still reach the kernel socket.
  const int keep = 1;
  ASSERT_EQ(::setsockopt(server_, SOL_SOCKET, SO_KEEPALIVE, &keep, sizeof(keep)), 0);
  int v = 0;
  socklen_t len = sizeof(v);
  ASSERT_EQ(::getsockopt(server_, SOL_SOCKET, SO_KEEPALIVE, &v, &len), 0);
  EXPECT_EQ(v, 1);
  ASSERT_EQ(::write(client_, "ok", 2), 2);
  char buf[3] = {};
  EXPECT_EQ(::recv(server_, buf, 2, MSG_WAITALL), 2);
}

TEST_F(StreamTest, SendfileAndSpliceMoveFileAndPipeBytes) {
  const auto data = Pattern(200'000, 9);
  FILE* f = std::tmpfile();
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(std::fwrite(data.data(), 1, data.size(), f), data.size());
  std::fflush(f);
  std::thread reader([&] { EXPECT_EQ(ReadAll(server_, data.size()), data); });
  off_t off = 0;
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = ::sendfile(client_, fileno(f), &off, data.size() - sent);
    ASSERT_GT(n, 0);
    sent += n;
  }
  reader.join();
  EXPECT_EQ(off, static_cast<off_t>(data.size()));
  std::fclose(f);
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  ASSERT_EQ(::write(p[1], "piped", 5), 5);
  EXPECT_EQ(::splice(p[0], nullptr, client_, nullptr, 5, 0), 5);
  EXPECT_EQ(::splice(server_, nullptr, p[1], nullptr, 5, 0), 5);
  char buf[6] = {};
  EXPECT_EQ(::read(p[0], buf, 5), 5);
  EXPECT_STREQ(buf, "piped");
  ::close(p[0]);
  ::close(p[1]);
}

TEST_F(StreamTest, AReceiveTimeoutEndsAWaitWithEagain) {
  timeval tv{0, 100'000};
  ASSERT_EQ(::setsockopt(server_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
  char c;
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(::read(server_, &c, 1), -1);
  EXPECT_EQ(errno, EAGAIN);
  const auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_GE(waited, std::chrono::milliseconds(95));
  EXPECT_LT(waited, std::chrono::milliseconds(2000));
}

namespace {
void OnAlarm(int) {}

// Installs OnAlarm for SIGALRM with or without SA_RESTART; restores the old one on exit.
struct AlarmHandler {
  explicit AlarmHandler(bool restart) {
    struct sigaction sa {};
    sa.sa_handler = &OnAlarm;
    sa.sa_flags = restart ? SA_RESTART : 0;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGALRM, &sa, &old);
  }
  ~AlarmHandler() { ::sigaction(SIGALRM, &old, nullptr); }
  struct sigaction old {};
};
}  // namespace

TEST_F(StreamTest, ASignalWithoutRestartInterruptsAWaitWithEintr) {
  AlarmHandler h(false);
  ::ualarm(100'000, 0);  // past the spin: the read sleeps in the kernel
  char c;
  EXPECT_EQ(::read(server_, &c, 1), -1);
  EXPECT_EQ(errno, EINTR);
}

TEST_F(StreamTest, ASignalWithRestartLetsTheWaitGoOn) {
  AlarmHandler h(true);
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    ASSERT_EQ(::write(client_, "z", 1), 1);
  });
  ::ualarm(100'000, 0);
  char c = 0;
  EXPECT_EQ(::read(server_, &c, 1), 1);
  EXPECT_EQ(c, 'z');
  late.join();
}

}  // namespace
}  // namespace ff::fsocket::testing
