// The device node the library answers for (verbs/src/rdmacm/device_files.cc): exactly the served
// path answers as a character device 231:192, mode 0666, through every interposed name;
// other paths and errno are libc's own; a real file at the path wins. The test executable
// links the library's objects, so its calls to stat() and friends reach the interposers
// just as a preloaded program's do.
#include "rdmacm/device_files.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "pod.h"

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
    ff::verbs::StopServingDeviceNode();
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
  ff::verbs::ServeDeviceNode(path());
  const int dirfd = ::open(dir(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(dirfd, 0);
  struct stat64 st64 {};
  // Each answers as the node, and errno stays what it was before the call.
  auto answered = [](const char* how, int rc, const auto& st) {
    EXPECT_EQ(rc, 0) << how;
    EXPECT_EQ(errno, EXDEV) << how;
    ExpectCharDevice(st, how);
  };
  errno = EXDEV;
  answered("stat", ::stat(path(), &st), st);
  answered("lstat", ::lstat(path(), &st), st);
  answered("fstatat", ::fstatat(AT_FDCWD, path(), &st, 0), st);
  answered("fstatat, absolute path", ::fstatat(dirfd, path(), &st, AT_SYMLINK_NOFOLLOW), st);
  answered("stat64", ::stat64(path(), &st64), st64);
  answered("lstat64", ::lstat64(path(), &st64), st64);
  answered("fstatat64", ::fstatat64(AT_FDCWD, path(), &st64, 0), st64);
  answered("__xstat", __xstat(kStatVer, path(), &st), st);
  answered("__xstat64", __xstat64(kStatVer, path(), &st64), st64);
  answered("__lxstat", __lxstat(kStatVer, path(), &st), st);
  answered("__lxstat64", __lxstat64(kStatVer, path(), &st64), st64);
  answered("__fxstatat", __fxstatat(kStatVer, AT_FDCWD, path(), &st, 0), st);
  answered("__fxstatat64", __fxstatat64(kStatVer, AT_FDCWD, path(), &st64, 0), st64);
  auto ok = [](int rc, const char* how) {
    EXPECT_EQ(rc, 0) << how;
    EXPECT_EQ(errno, EXDEV) << how;
  };
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
  ff::verbs::StopServingDeviceNode();
  EXPECT_EQ(::stat(path(), &st), -1);
  EXPECT_EQ(errno, ENOENT);
}

TEST_F(DeviceNode, OtherPathsAndTheirErrnoAreLibcs) {
  ff::verbs::ServeDeviceNode(path());
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
  ff::verbs::ServeDeviceNode(path());
  struct stat st {};
  ASSERT_EQ(::stat(path(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_size, 12);
  struct statx sx {};
  ASSERT_EQ(::statx(AT_FDCWD, path(), 0, STATX_BASIC_STATS, &sx), 0);
  EXPECT_TRUE(S_ISREG(sx.stx_mode));
  // A path the real file system refuses for another reason stays refused.
  const std::string under_file = std::string(path()) + "/uverbs0";
  ff::verbs::ServeDeviceNode(under_file);
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
  const std::string node = ff::verbs::DeviceNodePath("uverbs0");
  ASSERT_EQ(node, "/dev/infiniband/uverbs0");
  const bool real = ReallyExists(node.c_str());
  struct stat st {};
  EXPECT_EQ(::stat(node.c_str(), &st) == 0, real) << "nothing answers before the device exists";
  ListeningRouter router;
  ::setenv("FREEFLOW_DIR", router.dir().c_str(), 1);
  ::setenv("FFR_NAME", "ffrouter", 1);
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  EXPECT_NE(router.Accepted(), nullptr);
  ASSERT_NE(list, nullptr);
  ASSERT_EQ(n, 1);
  EXPECT_EQ(ff::verbs::DeviceNodePath(list[0]->dev_name), node);
  ibv_free_device_list(list);
  EXPECT_TRUE(UcxWouldUse(node.c_str()));
  if (!real) {
    ASSERT_EQ(::stat(node.c_str(), &st), 0);
    ExpectCharDevice(st, "the process's device node");
  }
}

}  // namespace
}  // namespace fftest
