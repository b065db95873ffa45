// Bells (fsocket/src/bells.h): a sleeper is woken on its bell, not on the kernel connection;
// a hostile peer cannot make ringing block; the bells' descriptors stay out of the program's
// way, and a program that closes or replaces one costs its stream only its bell. And the
// spin decision (spin.h).
#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "bells.h"
#include "spin.h"
#include "stream_fixture.h"

namespace ff::fsocket::testing {
namespace {

using BellTest = StreamPair;

int BellOf(int fd) {
  Ref s = Lookup(fd);
  return s ? s->bell.load() : -1;
}

// A read that sleeps (past any spin) and the byte that wakes it, 100 ms later.
void SleepingReadGets(int reader, int writer, const char* what) {
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ASSERT_EQ(::write(writer, what, 1), 1);
  });
  char c = 0;
  EXPECT_EQ(::read(reader, &c, 1), 1);
  EXPECT_EQ(c, what[0]);
  late.join();
}

// What a sleeper's arming makes the other end do, seen before anyone takes the bell.
TEST_F(BellTest, ArmingForDataOrRoomMakesTheOtherEndRingTheBell) {
  Ref server = Lookup(server_), client = Lookup(client_);
  ASSERT_TRUE(server && client);
  const int server_side = bell_[ff::proto::kStreamServer].get();
  const int client_side = bell_[ff::proto::kStreamClient].get();
  StreamArm(*server, POLLIN);  // as a reader about to sleep
  EXPECT_EQ(server->rx->rd_armed.load(), ff::kArmBell);
  ASSERT_EQ(::write(client_, "x", 1), 1);
  pollfd p{server_side, POLLIN, 0};
  EXPECT_EQ(::poll(&p, 1, 1000), 1) << "no bell for the sleeping reader";
  EXPECT_EQ(server->rx->rd_armed.load(), 0u) << "the ringer takes the word";
  EXPECT_EQ(KernelBytes(server_), 0);
  char b[8];
  EXPECT_EQ(::recv(server_side, b, sizeof(b), MSG_DONTWAIT), 1) << "one byte a ring";
  ASSERT_EQ(::write(client_, "y", 1), 1);  // nobody sleeps: no bell
  EXPECT_EQ(::poll(&p, 1, 0), 0);
  // A writer with room to spare asks for no bell (TCP wakes only a writer that found its
  // buffer full): the reader's consumption rings nobody.
  StreamArm(*client, POLLOUT);
  EXPECT_EQ(client->tx->wr_armed.load(), 0u);
  char c[2];
  ASSERT_EQ(::read(server_, c, 2), 2);
  p.fd = client_side;
  EXPECT_EQ(::poll(&p, 1, 0), 0) << "a bell for a writer that had room";
  // A writer waiting for room: the reader's consumption rings the writer's side.
  const auto fill = Pattern(ring_bytes_, 4);
  ASSERT_EQ(::write(client_, fill.data(), fill.size()), static_cast<ssize_t>(fill.size()));
  StreamArm(*client, POLLOUT);
  EXPECT_EQ(client->tx->wr_armed.load(), ff::kArmBell);
  ASSERT_EQ(::read(server_, c, 2), 2);
  EXPECT_EQ(::poll(&p, 1, 1000), 1) << "no bell for the writer waiting for room";
  EXPECT_EQ(KernelBytes(client_), 0);
}

// The armed word is the peer's to write: a value that is not kArmBell is rung on the kernel
// connection (one bell byte, which the peer's library takes as a bell), nothing else.
TEST_F(BellTest, AnArmedWordOfAnyOtherValueIsRungOnTheKernelConnection) {
  View();
  for (uint32_t value : {ff::kArmKernel, 7u, 0xdeadbeefu}) {
    RingOf(0)->rd_armed.store(value);  // ring 0: the client's bytes to the server
    ASSERT_EQ(::write(client_, "x", 1), 1);
    EXPECT_EQ(RingOf(0)->rd_armed.load(), 0u) << "the ringer takes the word";
    pollfd p{server_, POLLIN, 0};
    EXPECT_EQ(real::poll(&p, 1, 1000), 1);
    EXPECT_EQ(KernelBytes(server_), 1) << "value " << value;
    p.fd = bell_[ff::proto::kStreamServer].get();
    EXPECT_EQ(::poll(&p, 1, 0), 0) << "value " << value << " rang the bell";
    char c = 0;
    ASSERT_EQ(::read(server_, &c, 1), 1);
    EXPECT_EQ(c, 'x');
    StreamDrain(*Lookup(server_), server_);  // as a wait would
    EXPECT_EQ(KernelBytes(server_), 0);
  }
}

TEST_F(BellTest, ASleepingReaderIsRungOnItsBellNotOnTheKernelConnection) {
  ASSERT_GE(BellOf(server_), 0);
  for (int i = 0; i < 3; ++i) {
    SleepingReadGets(server_, client_, "a");
    EXPECT_EQ(KernelBytes(server_), 0) << "a bell went over the kernel connection";
    SleepingReadGets(client_, server_, "b");
    EXPECT_EQ(KernelBytes(client_), 0);
  }
  pollfd p{bell_[ff::proto::kStreamServer].get(), POLLIN, 0};
  EXPECT_EQ(::poll(&p, 1, 0), 0) << "the woken reader took its bell";
}

TEST_F(BellTest, AWriterWaitingForRoomIsRungOnItsBell) {
  const auto fill = Pattern(ring_bytes_, 5);
  ASSERT_EQ(::write(client_, fill.data(), fill.size()), static_cast<ssize_t>(fill.size()));
  std::thread reader([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_EQ(ReadAll(server_, fill.size()), fill);
  });
  const auto more = Pattern(1000, 6);
  EXPECT_EQ(::write(client_, more.data(), more.size()), 1000);  // sleeps for room
  reader.join();
  EXPECT_EQ(ReadAll(server_, 1000), more);
  EXPECT_EQ(KernelBytes(server_), 0);
}

// The peer never takes its bell (it fills), and has cleared O_NONBLOCK on the description
// this end writes through: ringing must neither block nor fail the write, and a full bell
// still wakes its sleeper.
TEST_F(BellTest, AFullBellWithoutONonblockNeverBlocksTheRinger) {
  const int to_server = bell_[ff::proto::kStreamClient].get();  // the client's side rings
  ASSERT_EQ(::fcntl(to_server, F_SETFL, ::fcntl(to_server, F_GETFL) & ~O_NONBLOCK), 0);
  char junk[4096] = {};
  int filled = 0;
  while (filled < 100'000 && ::send(to_server, junk, sizeof(junk), MSG_DONTWAIT) > 0) ++filled;
  ASSERT_LT(filled, 100'000) << "the bell never filled";
  for (int i = 0; i < 3; ++i) SleepingReadGets(server_, client_, "c");
}

TEST_F(BellTest, BellsSitHighAndCloseOnExec) {
  rlimit rl{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &rl), 0);
  const int floor =
      static_cast<int>(std::min<rlim_t>(rl.rlim_cur - std::min<rlim_t>(rl.rlim_cur / 8, 4096), 4096));
  for (int fd : {client_, server_}) {
    const int b = BellOf(fd);
    ASSERT_GE(b, floor);
    EXPECT_EQ(::fcntl(b, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  }
  EXPECT_GE(BellFdsHeld(), 2);
}

// The program closes the library's bell (a daemon closing every descriptor, a mistake): the
// stream forgets it first and is rung on the kernel connection from then on.
TEST_F(BellTest, AProgramThatClosesABellCostsItsStreamOnlyTheBell) {
  const int held = BellFdsHeld();
  const int bell = BellOf(server_);
  ASSERT_GE(bell, 0);
  ASSERT_EQ(::close(bell), 0);
  EXPECT_EQ(BellOf(server_), -1);
  EXPECT_EQ(BellFdsHeld(), held - 1);
  SleepingReadGets(server_, client_, "d");
  SleepingReadGets(client_, server_, "d");
  // Replaced by dup2: the same, and the program's file is never written to.
  const int wbell = BellOf(client_);
  ASSERT_GE(wbell, 0);
  int pipefd[2];
  ASSERT_EQ(::pipe2(pipefd, O_CLOEXEC | O_NONBLOCK), 0);
  ASSERT_EQ(::dup2(pipefd[1], wbell), wbell);
  EXPECT_EQ(BellOf(client_), -1);
  SleepingReadGets(server_, client_, "e");
  SleepingReadGets(client_, server_, "e");
  char c;
  EXPECT_EQ(::read(pipefd[0], &c, 1), -1) << "a bell reached the program's pipe";
  ::close(wbell);
  ::close(pipefd[0]);
  ::close(pipefd[1]);
}

TEST_F(BellTest, CloseRangeOverTheBellsForgetsThemAll) {
  const int lo = std::min(BellOf(client_), BellOf(server_));
  ASSERT_GE(lo, 0);
  ASSERT_EQ(::close_range(static_cast<unsigned>(lo), ~0u, 0), 0);
  EXPECT_EQ(BellOf(client_), -1);
  EXPECT_EQ(BellOf(server_), -1);
  EXPECT_EQ(BellFdsHeld(), 0);
  SleepingReadGets(server_, client_, "f");
  SleepingReadGets(client_, server_, "g");
}

TEST(SpinTest, SpinsOnlyWithACpuForEveryRunnableThread) {
  EXPECT_TRUE(SpinDecision(1, 2));
  EXPECT_TRUE(SpinDecision(2, 2));
  EXPECT_FALSE(SpinDecision(3, 2));
  EXPECT_FALSE(SpinDecision(-1, 2));
  EXPECT_EQ(RunnableOfLoadavg("0.51 0.40 0.33 3/99 5417\n"), 3);
  EXPECT_EQ(RunnableOfLoadavg("0.51 0.40 0.33 12/1099 5417\n"), 12);
  EXPECT_EQ(RunnableOfLoadavg("garbage"), -1);
  EXPECT_EQ(CpusOfQuota("max 100000\n"), 0);
  EXPECT_EQ(CpusOfQuota("150000 100000\n"), 2);
  EXPECT_EQ(CpusOfQuota("100000 100000\n"), 1);
  EXPECT_EQ(CpusOfQuota("x"), 0);
}

// The score moves an eighth of the way toward each outcome: spins that keep failing stop
// within a dozen waits, and a few successes bring them back.
TEST(SpinTest, TheScoreFollowsWhetherSpinsPay) {
  uint32_t s = kSpinScoreMax;
  int failures = 0;
  while (s >= kSpinScoreFloor && failures < 100) {
    s = NextSpinScore(s, false);
    ++failures;
  }
  EXPECT_LE(failures, 12);
  EXPECT_GE(failures, 8);
  for (int i = 0; i < 100; ++i) s = NextSpinScore(s, false);
  EXPECT_EQ(s, 0u);
  int successes = 0;
  while (s < kSpinScoreFloor && successes < 100) {
    s = NextSpinScore(s, true);
    ++successes;
  }
  EXPECT_LE(successes, 3);
  for (int i = 0; i < 100; ++i) s = NextSpinScore(s, true);
  EXPECT_EQ(s, kSpinScoreMax);
  EXPECT_EQ(NextSpinScore(10'000, true), kSpinScoreMax);  // out of range: clamped
}

}  // namespace
}  // namespace ff::fsocket::testing
