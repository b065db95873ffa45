// The device node the library answers for (verbs/src/device_files.cc): exactly the served
// path answers as a character device 231:192, mode 0666, through every interposed name;
// other paths and errno are libc's own; a real file at the path wins. The test executable
// links the library's objects, so its calls to stat() and friends reach the interposers
// just as a preloaded program's do.
#include "device_files.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "pod.h"

extern "C" {
int __xstat(int ver, const char* path, struct stat* buf) noexcept;
int __xstat64(int ver, const char* path, struct stat64* buf) noexcept;
int __lxstat(int ver, const char* path, struct stat* buf) noexcept;
int __lxstat64(int ver, const char* path, struct stat64* buf) noexcept;
int __fxstatat(int ver, int dirfd, const char* path, struct stat* buf, int flags) noexcept;
int __fxstatat64(int ver, int dirfd, const char* path, struct stat64* buf, int flags) noexcept;
}

namespace fftest {
namespace {

constexpr int kStatVer = 1;  // _STAT_VER_LINUX on x86-64, what old binaries pass

// A scratch folder; the served path is <folder>/uverbs0, absent unless a test makes it.
class DeviceNode : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(::mkdtemp(dir_), nullptr);
    path_ = std::string(dir_) + "/uverbs0";
  }
  void TearDown() override {
    ffv::StopServingDeviceNode();
    ::unlink(path_.c_str());
    ::rmdir(dir_);
  }
  const char* path() const { return path_.c_str(); }
  const char* dir() const { return dir_; }

 private:
  char dir_[32] = "/tmp/ffv-devnode-XXXXXX";
  std::string path_;
};

template <typename StatT>
void ExpectCharDevice(const StatT& st, const char* how) {
  EXPECT_TRUE(S_ISCHR(st.st_mode)) << how;
  EXPECT_EQ(st.st_mode & 07777, 0666u) << how;
  EXPECT_EQ(major(st.st_rdev), 231u) << how;
  EXPECT_EQ(minor(st.st_rdev), 192u) << how;
}

TEST_F(DeviceNode, TheServedPathAnswersAsACharacterDeviceThroughEveryName) {
  struct stat st {};
  ASSERT_EQ(::stat(path(), &st), -1);
  ASSERT_EQ(errno, ENOENT) << "nothing answers before the node is served";
  ffv::ServeDeviceNode(path());
  const int dirfd = ::open(dir(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(dirfd, 0);
  struct stat64 st64 {};
  // errno stays what it was before each successful call.
  auto ok = [](int rc, const char* how) {
    EXPECT_EQ(rc, 0) << how;
    EXPECT_EQ(errno, EXDEV) << how;
  };
  errno = EXDEV;
  ok(::stat(path(), &st), "stat");
  ExpectCharDevice(st, "stat");
  ok(::lstat(path(), &st), "lstat");
  ExpectCharDevice(st, "lstat");
  ok(::fstatat(AT_FDCWD, path(), &st, 0), "fstatat");
  ExpectCharDevice(st, "fstatat");
  ok(::fstatat(dirfd, path(), &st, AT_SYMLINK_NOFOLLOW), "fstatat, absolute path");
  ExpectCharDevice(st, "fstatat, absolute path");
  ok(::stat64(path(), &st64), "stat64");
  ExpectCharDevice(st64, "stat64");
  ok(::lstat64(path(), &st64), "lstat64");
  ExpectCharDevice(st64, "lstat64");
  ok(::fstatat64(AT_FDCWD, path(), &st64, 0), "fstatat64");
  ExpectCharDevice(st64, "fstatat64");
  ok(__xstat(kStatVer, path(), &st), "__xstat");
  ExpectCharDevice(st, "__xstat");
  ok(__xstat64(kStatVer, path(), &st64), "__xstat64");
  ExpectCharDevice(st64, "__xstat64");
  ok(__lxstat(kStatVer, path(), &st), "__lxstat");
  ExpectCharDevice(st, "__lxstat");
  ok(__lxstat64(kStatVer, path(), &st64), "__lxstat64");
  ExpectCharDevice(st64, "__lxstat64");
  ok(__fxstatat(kStatVer, AT_FDCWD, path(), &st, 0), "__fxstatat");
  ExpectCharDevice(st, "__fxstatat");
  ok(__fxstatat64(kStatVer, AT_FDCWD, path(), &st64, 0), "__fxstatat64");
  ExpectCharDevice(st64, "__fxstatat64");
  struct statx sx {};
  ok(::statx(AT_FDCWD, path(), 0, STATX_BASIC_STATS, &sx), "statx");
  EXPECT_TRUE(S_ISCHR(sx.stx_mode));
  EXPECT_EQ(sx.stx_mode & 07777, 0666u);
  EXPECT_EQ(sx.stx_rdev_major, 231u);
  EXPECT_EQ(sx.stx_rdev_minor, 192u);
  EXPECT_EQ(sx.stx_mask & STATX_TYPE, STATX_TYPE);
  ok(::access(path(), R_OK | W_OK), "access");
  ok(::access(path(), F_OK), "access F_OK");
  ok(::faccessat(AT_FDCWD, path(), R_OK | W_OK, AT_EACCESS), "faccessat");
  ok(::euidaccess(path(), R_OK | W_OK), "euidaccess");
  ok(::eaccess(path(), R_OK | W_OK), "eaccess");
  // Mode 0666 grants no execution, not even to root.
  EXPECT_EQ(::access(path(), X_OK), -1);
  EXPECT_EQ(errno, EACCES);
  ::close(dirfd);
  ffv::StopServingDeviceNode();
  EXPECT_EQ(::stat(path(), &st), -1);
  EXPECT_EQ(errno, ENOENT);
}

TEST_F(DeviceNode, OtherPathsAndTheirErrnoAreLibcs) {
  ffv::ServeDeviceNode(path());
  struct stat st {};
  const std::string others[] = {path() + std::string("x"), std::string(dir()) + "//uverbs0",
                                std::string(dir()) + "/./uverbs0", std::string(dir()) + "/uverbs1"};
  for (const std::string& other : others) {
    errno = 0;
    EXPECT_EQ(::stat(other.c_str(), &st), -1) << other;
    EXPECT_EQ(errno, ENOENT) << other;
    errno = 0;
    EXPECT_EQ(::access(other.c_str(), F_OK), -1) << other;
    EXPECT_EQ(errno, ENOENT) << other;
  }
  // A relative spelling is another path, even from the node's folder.
  const int dirfd = ::open(dir(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(dirfd, 0);
  EXPECT_EQ(::fstatat(dirfd, "uverbs0", &st, 0), -1);
  EXPECT_EQ(errno, ENOENT);
  EXPECT_EQ(::faccessat(dirfd, "uverbs0", F_OK, 0), -1);
  EXPECT_EQ(errno, ENOENT);
  ::close(dirfd);
  // Real files answer for themselves, and a success leaves errno alone.
  errno = EXDEV;
  ASSERT_EQ(::stat(dir(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(errno, EXDEV);
  ASSERT_EQ(::stat("/dev/null", &st), 0);
  EXPECT_EQ(major(st.st_rdev), 1u);
  EXPECT_EQ(minor(st.st_rdev), 3u);
  // Errors other than "no such file" are never turned into an answer.
  const char* volatile no_path = nullptr;  // hidden from the nonnull check
  errno = 0;
  EXPECT_EQ(::stat(no_path, &st), -1);
  EXPECT_EQ(errno, EFAULT);
  EXPECT_EQ(::access(path(), 0100000), -1) << "an invalid mode is refused first";
  EXPECT_EQ(errno, EINVAL);
}

TEST_F(DeviceNode, ARealFileAtThePathWins) {
  FILE* f = std::fopen(path(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs("a real node\n", f);
  std::fclose(f);
  ffv::ServeDeviceNode(path());
  struct stat st {};
  ASSERT_EQ(::stat(path(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_size, 12);
  struct statx sx {};
  ASSERT_EQ(::statx(AT_FDCWD, path(), 0, STATX_BASIC_STATS, &sx), 0);
  EXPECT_TRUE(S_ISREG(sx.stx_mode));
  // A path the real file system refuses for another reason stays refused.
  const std::string under_file = std::string(path()) + "/uverbs0";
  ffv::ServeDeviceNode(under_file);
  EXPECT_EQ(::stat(under_file.c_str(), &st), -1);
  EXPECT_EQ(errno, ENOTDIR);
  EXPECT_EQ(::access(under_file.c_str(), R_OK | W_OK), -1);
  EXPECT_EQ(errno, ENOTDIR);
}

// Whether `path` exists, asked of the kernel directly (no interposer in between).
bool ReallyExists(const char* path) {
  struct stat st {};
  return ::syscall(SYS_newfstatat, AT_FDCWD, path, &st, 0) == 0;
}

// As UCX asks (uct_ib_device_is_accessible): a character device that may be read and written.
bool UcxWouldUse(const char* path) {
  struct stat st {};
  return ::stat(path, &st) == 0 && S_ISCHR(st.st_mode) && ::access(path, R_OK | W_OK) == 0;
}

TEST(DeviceNodeOfTheProcess, AnswersOnceTheDeviceListFoundTheRouter) {
  const std::string node = ffv::DeviceNodePath("uverbs0");
  ASSERT_EQ(node, "/dev/infiniband/uverbs0");
  const bool real = ReallyExists(node.c_str());
  struct stat st {};
  EXPECT_EQ(::stat(node.c_str(), &st) == 0, real) << "nothing answers before the device exists";
  char dir[] = "/tmp/ffv-devlist-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string sock = std::string(dir) + "/ffrouter.sock";
  ff::UniqueFd listener(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strcpy(addr.sun_path, sock.c_str());
  ASSERT_EQ(::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(listener.get(), 1), 0);
  std::unique_ptr<FakeRouter> router;
  std::thread acceptor([&] {
    pollfd p{listener.get(), POLLIN, 0};
    if (::poll(&p, 1, 5000) == 1)
      router =
          std::make_unique<FakeRouter>(ff::UniqueFd(::accept(listener.get(), nullptr, nullptr)));
  });
  ::setenv("FREEFLOW_DIR", dir, 1);
  ::setenv("FFR_NAME", "ffrouter", 1);
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  acceptor.join();
  ::unlink(sock.c_str());
  ::rmdir(dir);
  ASSERT_NE(list, nullptr);
  ASSERT_EQ(n, 1);
  EXPECT_EQ(ffv::DeviceNodePath(list[0]->dev_name), node);
  ibv_free_device_list(list);
  EXPECT_TRUE(UcxWouldUse(node.c_str()));
  if (!real) {
    ASSERT_EQ(::stat(node.c_str(), &st), 0);
    ExpectCharDevice(st, "the process's device node");
  }
}

}  // namespace
}  // namespace fftest
