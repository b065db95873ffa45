// The rdma_cm device's open, stat and descriptor bookkeeping, and the command parsing and
// forwarding (verbs/src/rdmacm/cm_device.cc, cm_commands.cc), against the fake router.
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>

#include "cm_fixture.h"
#include "rdmacm/device_files.h"

namespace fftest {
namespace {

template <typename StatT>
void ExpectCmDevice(const StatT& st, const char* how) {
  EXPECT_TRUE(S_ISCHR(st.st_mode)) << how;
  EXPECT_EQ(major(st.st_rdev), ff::verbs::kCmMajor) << how;
  EXPECT_EQ(minor(st.st_rdev), ff::verbs::kCmMinor) << how;
}

TEST_F(CmTest, OpenGivesAChannelThatLooksLikeTheCharacterDevice) {
  uint32_t channel = 0;
  const int fd = Open(O_RDWR | O_CLOEXEC, &channel);
  ASSERT_GE(fd, 0);
  ASSERT_NE(channel, ff::proto::kNoId) << "the router was handed the channel";
  struct stat st {};
  ASSERT_EQ(::fstat(fd, &st), 0);
  ExpectCmDevice(st, "fstat");
  struct stat64 st64 {};
  ASSERT_EQ(::fstat64(fd, &st64), 0);
  ExpectCmDevice(st64, "fstat64");
  ASSERT_EQ(__fxstat(1, fd, &st), 0);
  ExpectCmDevice(st, "__fxstat");
  ASSERT_EQ(::fstatat(fd, "", &st, AT_EMPTY_PATH), 0);
  ExpectCmDevice(st, "fstatat AT_EMPTY_PATH");
  struct statx sx {};
  ASSERT_EQ(::statx(fd, "", AT_EMPTY_PATH, STATX_BASIC_STATS, &sx), 0);
  EXPECT_TRUE(S_ISCHR(sx.stx_mode));
  EXPECT_EQ(sx.stx_rdev_major, ff::verbs::kCmMajor);
  EXPECT_EQ((::fcntl(fd, F_GETFD) & FD_CLOEXEC), FD_CLOEXEC);
  EXPECT_EQ((::fcntl(fd, F_GETFL) & O_NONBLOCK), 0);
  // The router's end reaches the program's descriptor.
  SendEvent(channel, 0, kEstablished, 0);
  EXPECT_TRUE(Readable(fd, 1000));
}

TEST_F(CmTest, OpenFlagsReachTheDescriptor) {
  const int fd = Open(O_RDWR | O_NONBLOCK);
  ASSERT_GE(fd, 0);
  EXPECT_EQ((::fcntl(fd, F_GETFD) & FD_CLOEXEC), 0);
  EXPECT_EQ((::fcntl(fd, F_GETFL) & O_NONBLOCK), O_NONBLOCK);
  const int at = ::openat(AT_FDCWD, ff::verbs::kCmDevicePath, O_RDWR | O_CLOEXEC);
  ASSERT_GE(at, 0) << "openat serves the absolute path too";
  open_.push_back(at);
  EXPECT_TRUE(ff::verbs::IsCmFd(at));
}

TEST_F(CmTest, WithoutARouterTheRealFileSystemAnswers) {
  ff::verbs::UseCmSession(nullptr);  // as a process without a router
  errno = 0;
  const long real = ::syscall(SYS_openat, AT_FDCWD, ff::verbs::kCmDevicePath, O_RDWR | O_CLOEXEC);
  const int real_errno = errno;
  if (real >= 0) ::syscall(SYS_close, real);
  errno = 0;
  const int fd = ::open(ff::verbs::kCmDevicePath, O_RDWR | O_CLOEXEC);
  EXPECT_EQ(fd >= 0, real >= 0);
  if (fd >= 0) {
    EXPECT_FALSE(ff::verbs::IsCmFd(fd));
    ::close(fd);
  } else {
    EXPECT_EQ(errno, real_errno);
  }
  EXPECT_EQ(pod_.router.last_cm_channel(), ff::proto::kNoId);
}

TEST_F(CmTest, StatOfThePathAnswersOnceServed) {
  struct stat st {};
  const int before = ::stat(ff::verbs::kCmDevicePath, &st);
  ff::verbs::ServeCmNode();
  ASSERT_EQ(::stat(ff::verbs::kCmDevicePath, &st), 0);
  if (before != 0) ExpectCmDevice(st, "stat");  // a real node would win
  EXPECT_EQ(::access(ff::verbs::kCmDevicePath, R_OK | W_OK), 0);
  ff::verbs::StopServingDeviceNode();
}

TEST_F(CmTest, MalformedCommandsFailAsTheKernelFailsThem) {
  const int fd = Open();
  alignas(8) char buf[512] = {};
  rdma_ucm_cmd_hdr hdr{};
  auto write_with = [&](uint32_t cmd, uint16_t in, size_t len) {
    hdr = {cmd, in, 0};
    std::memcpy(buf, &hdr, sizeof(hdr));
    errno = 0;
    EXPECT_EQ(::write(fd, buf, len), -1) << "cmd " << cmd << " in " << in << " len " << len;
    return errno;
  };
  EXPECT_EQ(write_with(RDMA_USER_CM_CMD_CREATE_ID, 0, 7), EINVAL) << "shorter than a header";
  EXPECT_EQ(write_with(RDMA_USER_CM_CMD_JOIN_MCAST + 1, 0, 8), EINVAL) << "unknown command";
  EXPECT_EQ(write_with(RDMA_USER_CM_CMD_CREATE_ID, 24, 31), EINVAL) << "body past the write";
  EXPECT_EQ(write_with(RDMA_USER_CM_CMD_BIND, ff::proto::kCmMaxBody + 1, 400), EINVAL);
  EXPECT_EQ(write_with(RDMA_USER_CM_CMD_GET_OPTION, 0, 8), ENOSYS);
  EXPECT_TRUE(pod_.router.cm_commands().empty()) << "none reached the router";
  // A null response pointer where the kernel would write one.
  rdma_ucm_create_id b{};
  EXPECT_EQ(CmdErrno(fd, RDMA_USER_CM_CMD_CREATE_ID, b, 4), EFAULT);
  rdma_ucm_get_event g{};
  EXPECT_EQ(CmdErrno(fd, RDMA_USER_CM_CMD_GET_EVENT, g, sizeof(rdma_ucm_event_resp)), EFAULT);
}

TEST_F(CmTest, CommandsReachTheRouterAndAnswersTheProgram) {
  uint32_t channel = 0;
  const int fd = Open(O_RDWR | O_CLOEXEC, &channel);
  rdma_ucm_create_id_resp resp{};
  rdma_ucm_create_id b{};
  b.uid = 0x1234;
  b.response = Ptr(&resp);
  b.ps = RDMA_PS_UDP;
  ASSERT_EQ(WriteCmd(fd, RDMA_USER_CM_CMD_CREATE_ID, b, sizeof(resp)),
            static_cast<ssize_t>(sizeof(Wire<rdma_ucm_create_id>)));
  EXPECT_EQ(resp.id, 100u);
  const auto sent = Received(RDMA_USER_CM_CMD_CREATE_ID);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].channel, channel);
  EXPECT_EQ(sent[0].in_len, sizeof(b));
  EXPECT_EQ(sent[0].out_len, sizeof(resp));
  EXPECT_EQ(std::memcmp(sent[0].body, &b, sizeof(b)), 0);
  // The router's errno is the write's.
  status_[RDMA_USER_CM_CMD_BIND_IP] = EADDRINUSE;
  rdma_ucm_bind_ip bind{};
  bind.id = resp.id;
  EXPECT_EQ(CmdErrno(fd, RDMA_USER_CM_CMD_BIND_IP, bind), EADDRINUSE);
  // DESTROY_ID's events_reported is the library's count, not the router's.
  EXPECT_EQ(DestroyId(fd, resp.id), 0u);
}

// A route to the device names it by the session's device index, which only the library
// knows (it changes when a lost router is replaced; librdmacm finds the device by it); a
// route that leads to no device (no GUID) is left as the router wrote it.
TEST_F(CmTest, ARouteToTheDeviceNamesTheSessionsDeviceIndex) {
  uint32_t channel = 0;
  const int fd = Open(O_RDWR | O_CLOEXEC, &channel);
  const uint32_t id = CreateId(fd, 0x41);
  pod_.session->device.index = 3;
  uint64_t guid = 0x1122334455667788;
  pod_.router.OnCmCommand([&guid](const ff::proto::CmCommand& c, ff::proto::CmReply* r) {
    if (c.cmd != RDMA_USER_CM_CMD_QUERY_ROUTE) return 0;
    rdma_ucm_query_route_resp route{};
    route.node_guid = guid;
    route.ibdev_index = 0;
    route.port_num = 1;
    std::memcpy(r->out, &route, sizeof(route));
    r->out_len = sizeof(route);
    return 0;
  });
  rdma_ucm_query_route_resp route{};
  rdma_ucm_query q{};
  q.id = id;
  q.response = Ptr(&route);
  ASSERT_EQ(CmdErrno(fd, RDMA_USER_CM_CMD_QUERY_ROUTE, q, sizeof(route)), 0);
  EXPECT_EQ(route.node_guid, guid);
  EXPECT_EQ(route.ibdev_index, 3u);
  guid = 0;
  route = rdma_ucm_query_route_resp{};
  ASSERT_EQ(CmdErrno(fd, RDMA_USER_CM_CMD_QUERY_ROUTE, q, sizeof(route)), 0);
  EXPECT_EQ(route.ibdev_index, 0u);
  pod_.session->device.index = 0;
}

TEST_F(CmTest, SetOptionCarriesTheValueAndRefusesOversizedOnes) {
  const int fd = Open();
  const uint32_t id = CreateId(fd, 1);
  uint8_t tos = 0x5c;
  rdma_ucm_set_option b = SetOption(id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, sizeof(tos));
  ASSERT_EQ(CmdErrno(fd, RDMA_USER_CM_CMD_SET_OPTION, b), 0);
  auto sent = Received(RDMA_USER_CM_CMD_SET_OPTION);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].in_len, sizeof(b) + sizeof(tos));
  EXPECT_EQ(static_cast<uint8_t>(sent[0].body[sizeof(b)]), tos);
  b.optlen = ff::proto::kCmMaxBody - sizeof(b) + 1;
  EXPECT_EQ(CmdErrno(fd, RDMA_USER_CM_CMD_SET_OPTION, b), EINVAL);
  b.optval = 0;
  b.optlen = 1;
  EXPECT_EQ(CmdErrno(fd, RDMA_USER_CM_CMD_SET_OPTION, b), EFAULT);
  EXPECT_EQ(Received(RDMA_USER_CM_CMD_SET_OPTION).size(), 1u);
}

TEST_F(CmTest, MigrateIdNamesTheOldChannelByItsId) {
  uint32_t a_channel = 0, b_channel = 0;
  const int a = Open(O_RDWR | O_CLOEXEC, &a_channel);
  const int b = Open(O_RDWR | O_CLOEXEC, &b_channel);
  const uint32_t id = CreateId(a, 7);
  SendEvent(a_channel, id, kEstablished, id, 7);
  rdma_ucm_event_resp ev{};
  ASSERT_EQ(GetEvent(a, &ev), 0);
  rdma_ucm_migrate_resp resp{~0u};
  rdma_ucm_migrate_id m{};
  m.response = Ptr(&resp);
  m.id = id;
  m.fd = static_cast<uint32_t>(a);
  ASSERT_EQ(CmdErrno(b, RDMA_USER_CM_CMD_MIGRATE_ID, m, sizeof(resp)), 0);
  EXPECT_EQ(resp.events_reported, 1u) << "the program read one event of the id";
  auto sent = Received(RDMA_USER_CM_CMD_MIGRATE_ID);
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent[0].channel, b_channel);
  rdma_ucm_migrate_id seen{};
  std::memcpy(&seen, sent[0].body, sizeof(seen));
  EXPECT_EQ(seen.fd, a_channel);
  // A descriptor that is not a channel of this process names none.
  int pipefd[2];
  ASSERT_EQ(::pipe2(pipefd, O_CLOEXEC), 0);
  m.fd = static_cast<uint32_t>(pipefd[0]);
  ASSERT_EQ(CmdErrno(b, RDMA_USER_CM_CMD_MIGRATE_ID, m, sizeof(resp)), 0);
  std::memcpy(&seen, Received(RDMA_USER_CM_CMD_MIGRATE_ID).back().body, sizeof(seen));
  EXPECT_EQ(seen.fd, ff::proto::kNoId);
  ::close(pipefd[0]);
  ::close(pipefd[1]);
  // The id lives on b now: b's removal reports it, a's does not.
  pod_.router.DropCmChannel(a_channel);
  pod_.router.DropCmChannel(b_channel);
  ::fcntl(a, F_SETFL, O_NONBLOCK);
  EXPECT_EQ(GetEvent(a, &ev), EAGAIN);
  ASSERT_EQ(GetEvent(b, &ev), 0);
  EXPECT_EQ(ev.event, kDeviceRemoval);
  EXPECT_EQ(ev.id, id);
}

// Ordinary descriptors never take the rdma_cm path, and a number that stopped being a
// channel (closed, replaced by dup2/dup3, closed where the library did not see it) is an
// ordinary descriptor again.
class CmNumbers : public CmTest {
 protected:
  // Writes through `fd` and checks the bytes come out of `read_end`.
  static void ExpectPlainWrite(int fd, int read_end, const char* how) {
    const char msg[] = "plain bytes";
    ASSERT_EQ(::write(fd, msg, sizeof(msg)), static_cast<ssize_t>(sizeof(msg))) << how;
    char got[sizeof(msg)] = {};
    ASSERT_EQ(::read(read_end, got, sizeof(got)), static_cast<ssize_t>(sizeof(got))) << how;
    EXPECT_STREQ(got, msg) << how;
  }
  // A pipe whose write end takes descriptor number `number` (free, or any descriptor).
  static void PipeAt(int number, int pipefd[2]) {
    ASSERT_EQ(::pipe2(pipefd, O_CLOEXEC), 0);
    for (int i = 0; i < 2; ++i) {
      if (pipefd[i] != number) continue;
      const int moved = ::fcntl(pipefd[i], F_DUPFD_CLOEXEC, number + 1);
      ASSERT_GE(moved, 0);
      ::syscall(SYS_close, pipefd[i]);
      pipefd[i] = moved;
    }
    ASSERT_EQ(::syscall(SYS_dup3, pipefd[1], number, O_CLOEXEC), number);
    ::close(pipefd[1]);
    pipefd[1] = number;
  }
};

TEST_F(CmNumbers, OrdinaryDescriptorsWriteAsUsual) {
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  EXPECT_FALSE(ff::verbs::MaybeCmFd(p[1]));
  ExpectPlainWrite(p[1], p[0], "a pipe");
  const int cm = Open();
  EXPECT_TRUE(ff::verbs::MaybeCmFd(cm));
  EXPECT_FALSE(ff::verbs::MaybeCmFd(p[1])) << "a channel marks its own number only";
  ExpectPlainWrite(p[1], p[0], "a pipe beside a channel");
  ::close(p[0]);
  ::close(p[1]);
}

TEST_F(CmNumbers, AReusedNumberIsNeverAChannel) {
  int p[2];
  for (int how = 0; how < 5; ++how) {
    const int cm = Open();
    ASSERT_TRUE(ff::verbs::IsCmFd(cm));
    switch (how) {
      case 0:  // close, then the number is reused
        Close(cm);
        PipeAt(cm, p);
        break;
      case 1:  // dup2 over it
        ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
        ASSERT_EQ(::dup2(p[1], cm), cm);
        ::close(p[1]);
        p[1] = cm;
        std::erase(open_, cm);
        break;
      case 2:  // dup3 over it
        ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
        ASSERT_EQ(::dup3(p[1], cm, O_CLOEXEC), cm);
        ::close(p[1]);
        p[1] = cm;
        std::erase(open_, cm);
        break;
      case 3:  // close_range
        ASSERT_EQ(::close_range(cm, cm, 0), 0);
        std::erase(open_, cm);
        PipeAt(cm, p);
        break;
      default:  // a close the library does not see
        ASSERT_EQ(::syscall(SYS_close, cm), 0);
        std::erase(open_, cm);
        PipeAt(cm, p);
        break;
    }
    if (how < 4) {
      EXPECT_FALSE(ff::verbs::MaybeCmFd(cm)) << "the releasing call forgot it, case " << how;
    }
    ExpectPlainWrite(cm, p[0], "reused number");
    EXPECT_FALSE(ff::verbs::MaybeCmFd(cm)) << "forgotten at the latest on first use, case " << how;
    struct stat st {};
    ASSERT_EQ(::fstat(cm, &st), 0);
    EXPECT_TRUE(S_ISFIFO(st.st_mode)) << "fstat is libc's again, case " << how;
    ::close(p[0]);
    ::close(p[1]);
  }
}

TEST_F(CmNumbers, CloseRangeWithCloexecKeepsTheChannel) {
  const int cm = Open(O_RDWR);
  ASSERT_EQ(::close_range(cm, cm, CLOSE_RANGE_CLOEXEC), 0);
  EXPECT_TRUE(ff::verbs::IsCmFd(cm));
  EXPECT_EQ((::fcntl(cm, F_GETFD) & FD_CLOEXEC), FD_CLOEXEC);
}

}  // namespace
}  // namespace fftest
