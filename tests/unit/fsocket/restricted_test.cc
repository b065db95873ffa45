// A process that confines itself with seccomp, as OpenSSH's pre-authentication child does
// (read, write, poll and little else; anything more kills it), keeps using its streams: the
// library notices the prctl and makes no other system call on them from then on.
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#include <chrono>
#include <cstddef>
#include <thread>
#include <vector>

#include "stream_fixture.h"

namespace ff::fsocket::testing {
namespace {

// Allows exactly `allowed`; any other system call kills the process.
bool Confine(const std::vector<int>& allowed) {
  std::vector<sock_filter> f;
  f.push_back(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)));
  for (int nr : allowed) {
    f.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(nr), 0, 1));
    f.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
  }
  f.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS));
  sock_fprog prog{static_cast<unsigned short>(f.size()), f.data()};
  return ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
         ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0;
}

using RestrictedTest = StreamPair;

TEST_F(RestrictedTest, AChildConfinedToReadWriteAndPollKeepsItsStream) {
  ASSERT_EQ(::write(client_, "early", 5), 5);  // a bell may be waiting already
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (!Confine({SYS_read, SYS_write, SYS_poll, SYS_futex, SYS_exit, SYS_exit_group,
                  SYS_clock_nanosleep, SYS_nanosleep, SYS_getpid, SYS_rt_sigprocmask,
                  SYS_restart_syscall, SYS_rt_sigreturn, SYS_munmap, SYS_close}))
      ::_exit(2);
    char buf[16] = {};
    bool ok = ::read(server_, buf, 5) == 5;  // no sleep: the bytes are there
    ok = ok && ::read(server_, buf, 4) == 4 && std::memcmp(buf, "late", 4) == 0;  // sleeps
    ok = ok && ::write(server_, "back", 4) == 4;
    pollfd p{server_, POLLIN, 0};
    ok = ok && ::poll(&p, 1, 5000) == 1 && ::read(server_, buf, 3) == 3;
    ::_exit(ok ? 0 : 1);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(150));  // past its spin: it sleeps
  ASSERT_EQ(::write(client_, "late", 4), 4);
  char buf[5] = {};
  pollfd p{client_, POLLIN, 0};  // bounded: a child killed by its filter never answers
  EXPECT_EQ(::poll(&p, 1, 5000), 1);
  if (p.revents & POLLIN) {
    EXPECT_EQ(::recv(client_, buf, 4, MSG_WAITALL), 4);
    EXPECT_STREQ(buf, "back");
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  ASSERT_EQ(::write(client_, "end", 3), 3);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status)) << "killed by signal "
                                 << (WIFSIGNALED(status) ? WTERMSIG(status) : 0)
                                 << " (31 = SIGSYS: a system call outside the filter)";
  EXPECT_EQ(WIFEXITED(status) ? WEXITSTATUS(status) : -1, 0);
}

}  // namespace
}  // namespace ff::fsocket::testing
