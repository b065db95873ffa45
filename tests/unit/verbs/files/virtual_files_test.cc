// The virtual tree (verbs/src/files/): its path walk, and the tree served through every
// interposed libc name where the file system has nothing. A tree of the test's own is
// served under /sys/class/fftest (absent on any machine) for each test; the test executable
// links the library's objects, so its libc calls reach the interposers as a preloaded
// program's do.
#include "files/virtual_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <string>

#include "files/virtual_tree.h"
#include "views/sysfs_view.h"

namespace fftest {
namespace {

using ff::verbs::vfs::Found;
using ff::verbs::vfs::Kind;
using ff::verbs::vfs::Tree;

const char* const kRoot = "/sys/class/fftest";

// /sys/class/fftest/dev0 -> ../../devices/fftest/dev0 (a class link, as sysfs has), with a
// file, a port directory, a link back up and a link to itself.
std::shared_ptr<const Tree> TestTree() {
  auto t = std::make_shared<Tree>();
  t->AddLink("/sys/class/fftest/dev0", "../../devices/fftest/dev0");
  t->AddFile("/sys/devices/fftest/dev0/node_type", "1: CA\n");
  t->AddFile("/sys/devices/fftest/dev0/ports/1/state", "4: ACTIVE\n");
  t->AddFile("/sys/devices/fftest/dev0/ports/1/rate", "100 Gb/sec (4X EDR)\n");
  t->AddLink("/sys/devices/fftest/dev0/device", "../../fftest");
  t->AddLink("/sys/devices/fftest/dev0/loop", "loop");
  t->AddFile("/sys/class/net/lo/mtu", "not the real one\n");  // the real file must win
  return t;
}

std::shared_ptr<const Tree> BuildTestTree() { return TestTree(); }

class VirtualFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    ff::verbs::vfs::SetBuilder(&BuildTestTree,
                               {"/sys/class/fftest", "/sys/devices/fftest", "/sys/class/net"});
    ff::verbs::vfs::ResetServed();
  }
  void TearDown() override {
    ::chdir("/");
    ff::verbs::vfs::ResetServed();
    ff::verbs::vfs::SetBuilder(&ff::verbs::BuildSysfsView, ff::verbs::SysfsRoots());
  }
};

std::string ReadAll(int fd) {
  std::string out;
  char buf[256];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  return out;
}

std::string ReadPath(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return "<" + std::string(std::strerror(errno)) + ">";
  std::string s = ReadAll(fd);
  ::close(fd);
  return s;
}

std::set<std::string> List(DIR* d) {
  std::set<std::string> names;
  while (const dirent* e = ::readdir(d)) names.insert(e->d_name);
  return names;
}

TEST(VirtualTree, PathsResolveAsTheKernelResolvesThem) {
  const auto t = TestTree();
  int err = 0;
  auto f = t->Resolve("/sys/class/fftest/dev0/ports/1/state", true, &err);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->path, "/sys/devices/fftest/dev0/ports/1/state");
  EXPECT_EQ(f->node->data, "4: ACTIVE\n");
  f = t->Resolve("/sys/class/fftest/dev0", false, &err);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->node->kind, Kind::kLink) << "the last link is not followed when not asked";
  f = t->Resolve("/sys/class/fftest/dev0/", false, &err);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->node->kind, Kind::kDir) << "a trailing slash follows it";
  f = t->Resolve("/sys/class/fftest/dev0/ports/../device/dev0/./ports//1", true, &err);
  ASSERT_TRUE(f.has_value());
  EXPECT_EQ(f->path, "/sys/devices/fftest/dev0/ports/1") << "'..' is physical, after links";
  EXPECT_EQ(t->Resolve("/../../sys/devices", true, &err)->path, "/sys/devices");

  EXPECT_FALSE(t->Resolve("/sys/class/fftest/dev1", true, &err));
  EXPECT_EQ(err, ENOENT);
  EXPECT_FALSE(t->Resolve("/sys/class/fftest/dev0/node_type/x", true, &err));
  EXPECT_EQ(err, ENOTDIR);
  EXPECT_FALSE(t->Resolve("/sys/class/fftest/dev0/node_type/.", true, &err));
  EXPECT_EQ(err, ENOTDIR);
  EXPECT_FALSE(t->Resolve("/sys/class/fftest/dev0/loop", true, &err));
  EXPECT_EQ(err, ELOOP);
  EXPECT_FALSE(t->Resolve("sys/class", true, &err));
  EXPECT_EQ(err, EINVAL);
}

TEST(VirtualTree, ABuilderBugIsRefused) {
  Tree t;
  t.AddFile("/a/file", "x");
  EXPECT_THROW(t.AddDir("/a/file"), std::invalid_argument);
  EXPECT_THROW(t.AddFile("/a/file/below", "x"), std::invalid_argument);
  EXPECT_THROW(t.AddFile("relative", "x"), std::invalid_argument);
  EXPECT_THROW(t.AddFile("/a/..", "x"), std::invalid_argument);
}

TEST(SysfsText, RatesAndCpuMasksAreTheKernelsText) {
  EXPECT_EQ(ff::verbs::RateText(32, 2), "100 Gb/sec (4X EDR)");
  EXPECT_EQ(ff::verbs::RateText(1, 1), "2.5 Gb/sec (1X SDR)");
  EXPECT_EQ(ff::verbs::RateText(16, 8), "168 Gb/sec (12X FDR)");
  EXPECT_EQ(ff::verbs::RateText(64, 16), "100 Gb/sec (2X HDR)");
  EXPECT_EQ(ff::verbs::RateText(32, 3), "") << "an unknown width fails the read";
  EXPECT_EQ(ff::verbs::CpuMaskText("0-1", 2), "3");
  EXPECT_EQ(ff::verbs::CpuMaskText("0-3,8", 12), "10f");
  EXPECT_EQ(ff::verbs::CpuMaskText("0-63", 64), "ffffffff,ffffffff");
  EXPECT_EQ(ff::verbs::CpuMaskText("1,40", 48), "0100,00000002");
  EXPECT_EQ(ff::verbs::CpuMaskText("0-4", 4), "") << "a CPU past the mask is malformed";
  EXPECT_EQ(ff::verbs::CpuMaskText("x", 4), "");
}

TEST_F(VirtualFiles, FilesOpenReadOnlyWithTheirContentThroughEveryName) {
  const std::string state = std::string(kRoot) + "/dev0/ports/1/state";
  EXPECT_EQ(ReadPath(state), "4: ACTIVE\n");
  const int fd = ::openat(AT_FDCWD, state.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  char c = 'x';
  EXPECT_EQ(::write(fd, &c, 1), -1);
  EXPECT_EQ(errno, EBADF) << "opened read-only, as a sysfs attribute";
  struct stat st {};
  ASSERT_EQ(::fstat(fd, &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(::fcntl(fd, F_GETFD) & FD_CLOEXEC, 0) << "no O_CLOEXEC asked";
  ::close(fd);

  FILE* f = ::fopen(state.c_str(), "re");
  ASSERT_NE(f, nullptr);
  char line[64] = "";
  ASSERT_NE(std::fgets(line, sizeof(line), f), nullptr);
  EXPECT_STREQ(line, "4: ACTIVE\n");
  std::fclose(f);

  errno = 0;
  EXPECT_EQ(::open(state.c_str(), O_WRONLY), -1);
  EXPECT_EQ(errno, EROFS);
  EXPECT_EQ(::fopen(state.c_str(), "w"), nullptr);
  EXPECT_EQ(errno, EROFS);
  EXPECT_EQ(::open(state.c_str(), O_RDONLY | O_DIRECTORY), -1);
  EXPECT_EQ(errno, ENOTDIR);
  EXPECT_EQ(::open((std::string(kRoot) + "/dev0/loop").c_str(), O_RDONLY), -1);
  EXPECT_EQ(errno, ELOOP);
  EXPECT_EQ(::open((std::string(kRoot) + "/dev0/none").c_str(), O_RDONLY), -1);
  EXPECT_EQ(errno, ENOENT) << "what the tree lacks fails as the file system did";
  EXPECT_EQ(::open((std::string(kRoot) + "/dev0/node_type/x").c_str(), O_RDONLY), -1);
  EXPECT_EQ(errno, ENOTDIR);
}

int g_builds = 0;
std::shared_ptr<const Tree> CountingBuild() {
  ++g_builds;
  return TestTree();
}

TEST_F(VirtualFiles, OnlyAPathUnderTheRootsBuildsTheTree) {
  ff::verbs::vfs::SetBuilder(&CountingBuild, {"/sys/class/fftest"});
  g_builds = 0;
  struct stat st {};
  EXPECT_EQ(::stat("/sys/class/fftest-not/x", &st), -1);
  EXPECT_EQ(::stat("/sys/devices/fftest/dev0/node_type", &st), -1) << "in the tree, not a root";
  EXPECT_EQ(::stat("/sys/kernel/none", &st), -1);
  EXPECT_EQ(errno, ENOENT);
  EXPECT_EQ(g_builds, 0) << "a program probing other missing paths pays nothing";
  EXPECT_EQ(::stat("/sys/class/./fftest/dev0/node_type", &st), 0);
  EXPECT_EQ(g_builds, 1);
  EXPECT_EQ(::stat("/sys/class/fftest/dev0/ports", &st), 0);
  EXPECT_EQ(g_builds, 1) << "built once";
}

TEST_F(VirtualFiles, ARealFileAlwaysWins) {
  EXPECT_NE(ReadPath("/sys/class/net/lo/mtu"), "not the real one\n");
  EXPECT_EQ(ReadPath("/sys/class/net/lo/mtu").substr(0, 1).find_first_of("0123456789"), 0u);
  DIR* d = ::opendir("/sys/class/net");
  ASSERT_NE(d, nullptr);
  EXPECT_TRUE(List(d).count("lo")) << "a real directory lists what is really there";
  ::closedir(d);
}

TEST_F(VirtualFiles, StatAndAccessAnswerAsAReadOnlySysfs) {
  const std::string dev = std::string(kRoot) + "/dev0";
  struct stat st {};
  ASSERT_EQ(::lstat(dev.c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode));
  ASSERT_EQ(::stat(dev.c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0755u);
  struct stat sys {};
  ASSERT_EQ(::stat("/sys", &sys), 0);
  EXPECT_EQ(st.st_dev, sys.st_dev) << "one file system with the real /sys";
  ASSERT_EQ(::stat((dev + "/node_type").c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0444u);
  EXPECT_EQ(st.st_size, 4096);
  struct statx sx {};
  ASSERT_EQ(::statx(AT_FDCWD, dev.c_str(), AT_SYMLINK_NOFOLLOW, STATX_BASIC_STATS, &sx), 0);
  EXPECT_TRUE(S_ISLNK(sx.stx_mode));
  EXPECT_EQ(sx.stx_ino, static_cast<uint64_t>(::lstat(dev.c_str(), &st) == 0 ? st.st_ino : 0));
  EXPECT_EQ(::access((dev + "/node_type").c_str(), R_OK), 0);
  EXPECT_EQ(::access((dev + "/node_type").c_str(), W_OK), -1);
  EXPECT_EQ(errno, EROFS);
  EXPECT_EQ(::access((dev + "/node_type").c_str(), X_OK), -1);
  EXPECT_EQ(errno, EACCES);
  EXPECT_EQ(::faccessat(AT_FDCWD, (dev + "/ports").c_str(), R_OK | X_OK, 0), 0);
  EXPECT_EQ(::access((dev + "/nothing").c_str(), F_OK), -1);
  EXPECT_EQ(errno, ENOENT);
  char value[8];
  EXPECT_EQ(::lgetxattr(dev.c_str(), "security.selinux", value, sizeof(value)), -1);
  EXPECT_EQ(errno, ENODATA);
  EXPECT_EQ(::llistxattr(dev.c_str(), value, sizeof(value)), 0);
}

TEST_F(VirtualFiles, LinksReadAndResolveInsideTheTree) {
  const std::string dev = std::string(kRoot) + "/dev0";
  char buf[PATH_MAX];
  const ssize_t n = ::readlink(dev.c_str(), buf, sizeof(buf));
  ASSERT_GT(n, 0);
  EXPECT_EQ(std::string(buf, static_cast<size_t>(n)), "../../devices/fftest/dev0");
  EXPECT_EQ(::readlink(dev.c_str(), buf, 4), 4) << "truncated, as readlink does";
  EXPECT_EQ(::readlink((dev + "/node_type").c_str(), buf, sizeof(buf)), -1);
  EXPECT_EQ(errno, EINVAL);
  ASSERT_NE(::realpath((dev + "/device").c_str(), buf), nullptr);
  EXPECT_STREQ(buf, "/sys/devices/fftest");
  char* owned = ::canonicalize_file_name((dev + "/ports/1/../1/rate").c_str());
  ASSERT_NE(owned, nullptr);
  EXPECT_STREQ(owned, "/sys/devices/fftest/dev0/ports/1/rate");
  std::free(owned);
  EXPECT_EQ(::realpath((dev + "/loop").c_str(), buf), nullptr);
  EXPECT_EQ(errno, ELOOP);
}

TEST_F(VirtualFiles, DirectoriesListThroughEveryStreamCall) {
  DIR* d = ::opendir(kRoot);
  ASSERT_NE(d, nullptr);
  const dirent* e;
  std::set<std::string> names;
  while ((e = ::readdir(d)) != nullptr) {
    names.insert(e->d_name);
    if (std::strcmp(e->d_name, "dev0") == 0) {
      EXPECT_EQ(e->d_type, DT_LNK);
    }
  }
  EXPECT_EQ(names, (std::set<std::string>{".", "..", "dev0"}));
  ::rewinddir(d);
  dirent64 entry{};
  dirent64* result = nullptr;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  EXPECT_EQ(::readdir64_r(d, &entry, &result), 0);  // old programs still call it
#pragma GCC diagnostic pop
  EXPECT_EQ(result, &entry);
  EXPECT_STREQ(entry.d_name, ".");
  const long at = ::telldir(d);
  ASSERT_NE(::readdir64(d), nullptr);
  ::seekdir(d, at);
  EXPECT_STREQ(::readdir64(d)->d_name, "..");

  // dirfd: a descriptor of the directory, for the *at calls.
  const int fd = ::dirfd(d);
  ASSERT_GE(fd, 0);
  struct stat st {};
  ASSERT_EQ(::fstat(fd, &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  ASSERT_EQ(::fstatat(fd, "dev0/node_type", &st, 0), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  const int file = ::openat(fd, "dev0/ports/1/state", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(file, 0);
  EXPECT_EQ(ReadAll(file), "4: ACTIVE\n");
  ::close(file);
  EXPECT_EQ(::closedir(d), 0);

  dirent** list = nullptr;
  const int n =
      ::scandir((std::string(kRoot) + "/dev0/ports/1").c_str(), &list, nullptr, ::alphasort);
  ASSERT_EQ(n, 4);
  EXPECT_STREQ(list[0]->d_name, ".");
  EXPECT_STREQ(list[2]->d_name, "rate");
  EXPECT_STREQ(list[3]->d_name, "state");
  for (int i = 0; i < n; ++i) std::free(list[i]);
  std::free(list);

  EXPECT_EQ(::opendir((std::string(kRoot) + "/dev0/node_type").c_str()), nullptr);
  EXPECT_EQ(errno, ENOTDIR);
  EXPECT_EQ(::scandir((std::string(kRoot) + "/none").c_str(), &list, nullptr, nullptr), -1);
  EXPECT_EQ(errno, ENOENT);
}

TEST_F(VirtualFiles, DirectoryDescriptorsAndTheirCopiesServeTheAtCalls) {
  const int fd = ::open((std::string(kRoot) + "/dev0/ports").c_str(), O_RDONLY | O_DIRECTORY);
  ASSERT_GE(fd, 0);
  const int copy = ::dup(fd);
  ASSERT_GE(copy, 0);
  ::close(fd);
  const int state = ::openat(copy, "1/state", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(state, 0) << std::strerror(errno);
  EXPECT_EQ(ReadAll(state), "4: ACTIVE\n");
  ::close(state);
  EXPECT_EQ(::openat(copy, "1/none", O_RDONLY), -1);
  EXPECT_EQ(errno, ENOENT);
  DIR* d = ::fdopendir(copy);
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(List(d), (std::set<std::string>{".", "..", "1"}));
  ::closedir(d);
  EXPECT_EQ(::fcntl(copy, F_GETFD), -1) << "closedir closed the descriptor fdopendir took";

  // A number reused by an unrelated file is that file again.
  const int other = ::open("/dev/null", O_RDONLY);
  EXPECT_EQ(::openat(other, "1/state", O_RDONLY), -1);
  EXPECT_EQ(errno, ENOTDIR);
  ::close(other);
  EXPECT_EQ(::open((std::string(kRoot) + "/dev0").c_str(), O_WRONLY), -1);
  EXPECT_EQ(errno, EISDIR);
}

TEST_F(VirtualFiles, AWorkingDirectoryInsideTheTreeServesRelativePaths) {
  char cwd[PATH_MAX];
  ASSERT_EQ(::chdir((std::string(kRoot) + "/dev0/ports").c_str()), 0);
  ASSERT_NE(::getcwd(cwd, sizeof(cwd)), nullptr);
  EXPECT_STREQ(cwd, "/sys/devices/fftest/dev0/ports");
  EXPECT_EQ(ReadPath("1/state"), "4: ACTIVE\n");
  DIR* d = ::opendir(".");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(List(d), (std::set<std::string>{".", "..", "1"}));
  ::closedir(d);
  struct stat st {};
  EXPECT_EQ(::stat("../node_type", &st), 0);
  EXPECT_EQ(::chdir("1/state"), -1);
  EXPECT_EQ(errno, ENOTDIR);
  EXPECT_EQ(::getcwd(cwd, 4), nullptr);
  EXPECT_EQ(errno, ERANGE);
  ASSERT_EQ(::chdir("../../../.."), 0) << "back out into the real /sys";
  ASSERT_NE(::getcwd(cwd, sizeof(cwd)), nullptr);
  EXPECT_STREQ(cwd, "/sys");
  EXPECT_EQ(::stat("class/net", &st), 0) << "relative paths are the real file system's again";
}

}  // namespace
}  // namespace fftest
