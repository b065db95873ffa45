// The router's tables (base/table_store.h): what a pod that holds a table's read-only
// descriptor can do to it (each way of writing is tried), what a second process that holds
// the read-write one can (write it, as the router that takes over from this one must), and
// which pairs of descriptors a successor adopts.
#include "base/table_store.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "freeflow/fd.h"
#include "objects/mr_table.h"

namespace ff::router {
namespace {

constexpr size_t kBytes = 1 << 20;

// Every way the holder of `fd` could change the table behind it that worked.
std::vector<std::string> WritesThrough(int fd, bool reopen = true) {
  std::vector<std::string> worked;
  if (reopen) {
    // A memfd reopens read-write (its seals then refuse the writes); a table on the
    // router's tmpfs does not reopen at all.
    const std::string self = "/proc/self/fd/" + std::to_string(fd);
    UniqueFd again(::open(self.c_str(), O_RDWR | O_CLOEXEC));
    if (again) {
      for (const std::string& w : WritesThrough(again.get(), false))
        worked.push_back(w + " (of a read-write reopen)");
    }
  }
  void* p = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p != MAP_FAILED) {
    worked.push_back("a writable mapping");
    ::munmap(p, kBytes);
  }
  char c = 0;
  if (::pwrite(fd, &c, 1, 0) == 1) worked.push_back("pwrite");
  if (::ftruncate(fd, 0) == 0) worked.push_back("ftruncate");
  if (::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096) == 0)
    worked.push_back("a punched hole");
  void* ro = ::mmap(nullptr, kBytes, PROT_READ, MAP_SHARED, fd, 0);
  if (ro != MAP_FAILED) {
    if (::mprotect(ro, kBytes, PROT_READ | PROT_WRITE) == 0) worked.push_back("mprotect");
    ::munmap(ro, kBytes);
  }
  return worked;
}

std::string Joined(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& w : v) s += (s.empty() ? "" : ", ") + w;
  return s;
}

// The router runs as root with CAP_SYS_ADMIN, so there the tables are on its tmpfs; a test
// run without those privileges can only check the sealed memfds it then gets.
bool ExpectMovable(TableStore& store) {
  if (store.movable()) return true;
  EXPECT_NE(::geteuid(), 0u) << "root, yet no private tmpfs: " << store.why_not();
  return false;
}

TEST(TableStoreTest, APodCannotChangeOrShrinkTheTableItReads) {
  TableStore store;
  UniqueFd rw, ro;
  Mapping router;
  ASSERT_EQ(store.Make("test-table", kBytes, &rw, &ro, &router), 0);
  const bool sealed = !ExpectMovable(store);
  EXPECT_EQ(SealedReadOnly(rw.get()), sealed) << "a memfd is sealed, a tmpfs file cannot be";
  std::memcpy(router.get(), "entry", 6);

  EXPECT_TRUE(RouterTableAtLeast(ro.get(), kBytes));
  EXPECT_FALSE(RouterTableAtLeast(ro.get(), kBytes + 1)) << "larger than it is";
  if (!sealed) {
    const std::string self = "/proc/self/fd/" + std::to_string(ro.get());
    errno = 0;
    EXPECT_FALSE(UniqueFd(::open(self.c_str(), O_RDWR | O_CLOEXEC)));
    EXPECT_EQ(errno, EROFS) << "a reopen of the pods' descriptor";
  }
  const std::vector<std::string> worked = WritesThrough(ro.get());
  EXPECT_TRUE(worked.empty()) << "changed through " << Joined(worked);
  Mapping pod;
  ASSERT_EQ(MapRouterTable(ro.get(), kBytes, &pod), 0);
  EXPECT_STREQ(pod.as<const char>(), "entry");
  std::memcpy(static_cast<char*>(router.get()) + 4096, "later", 6);
  EXPECT_STREQ(pod.as<const char>() + 4096, "later") << "the pod sees what the router writes";
}

TEST(TableStoreTest, AnotherProcessWithTheReadWriteDescriptorWritesTheTable) {
  TableStore store;
  UniqueFd rw, ro;
  Mapping first;  // the router that made it
  ASSERT_EQ(store.Make("test-table", kBytes, &rw, &ro, &first), 0);
  if (!ExpectMovable(store)) GTEST_SKIP() << "not root: " << store.why_not();
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // the router that takes over: its own writable mapping
    void* p = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, rw.get(), 0);
    if (p == MAP_FAILED) ::_exit(1);
    std::memcpy(p, "successor", 10);
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "could not map it writable";
  Mapping pod;
  ASSERT_EQ(MapRouterTable(ro.get(), kBytes, &pod), 0);
  EXPECT_STREQ(pod.as<const char>(), "successor");
}

TEST(TableStoreTest, OnlyTheRoutersTablesPassItsCheck) {
  TableStore store;
  UniqueFd rw, ro;
  Mapping router;
  ASSERT_EQ(store.Make("test-table", kBytes, &rw, &ro, &router), 0);
  if (store.movable()) {
    EXPECT_FALSE(RouterTableAtLeast(rw.get(), kBytes)) << "a read-write descriptor";
  }
  // A memfd whose maker can still shrink it (no seals), handed over read-only.
  UniqueFd loose(::memfd_create("loose", MFD_CLOEXEC));
  ASSERT_TRUE(loose);
  ASSERT_EQ(::ftruncate(loose.get(), kBytes), 0);
  const std::string self = "/proc/self/fd/" + std::to_string(loose.get());
  UniqueFd loose_ro(::open(self.c_str(), O_RDONLY | O_CLOEXEC));
  EXPECT_FALSE(RouterTableAtLeast(loose_ro.get(), kBytes));
  Mapping m;
  EXPECT_EQ(MapRouterTable(loose_ro.get(), kBytes, &m), EINVAL);
}

// What a successor router adopts (TableStore::Adopt): a table and its own read-only
// descriptor; not a read-only descriptor of one table beside the read-write one of another
// (it would write a table pods do not read), a loose memfd, or too few bytes.
TEST(TableStoreTest, ASuccessorAdoptsATableOnlyByBothItsDescriptors) {
  TableStore store;
  UniqueFd rw, ro, rw2, ro2;
  Mapping first, second;
  ASSERT_EQ(store.Make("test-table", kBytes, &rw, &ro, &first), 0);
  ASSERT_EQ(store.Make("test-table-2", kBytes, &rw2, &ro2, &second), 0);
  Mapping adopted;
  if (!ExpectMovable(store)) {
    EXPECT_EQ(TableStore::Adopt(rw.get(), ro.get(), kBytes, &adopted),
              "it cannot be mapped writable (a sealed memfd of an older router)");
    return;
  }
  ASSERT_EQ(TableStore::Adopt(rw.get(), ro.get(), kBytes, &adopted), "");
  std::memcpy(adopted.get(), "successor", 10);
  Mapping pod;
  ASSERT_EQ(MapRouterTable(ro.get(), kBytes, &pod), 0);
  EXPECT_STREQ(pod.as<const char>(), "successor") << "pods read what the successor writes";

  Mapping m;
  EXPECT_EQ(TableStore::Adopt(rw2.get(), ro.get(), kBytes, &m),
            "its two descriptors are not the same file");
  EXPECT_EQ(TableStore::Adopt(rw.get(), ro.get(), kBytes + 1, &m),
            "its read-only descriptor is not a router table");
  EXPECT_EQ(TableStore::Adopt(rw.get(), rw.get(), kBytes, &m),
            "its read-only descriptor is not a router table");
  UniqueFd loose(::memfd_create("loose", MFD_CLOEXEC));
  ASSERT_TRUE(loose);
  ASSERT_EQ(::ftruncate(loose.get(), kBytes), 0);
  EXPECT_EQ(TableStore::Adopt(loose.get(), ro.get(), kBytes, &m),
            "its two descriptors are not the same file");
  EXPECT_EQ(m.get(), nullptr) << "nothing mapped for a refused pair";
}

TEST(TableStoreTest, TheMrTableIsMadeThere) {
  MrTable t;
  ASSERT_EQ(t.Create(), 0);
  EXPECT_TRUE(RouterTableAtLeast(t.read_only_fd(), kMrTableBytes));
  const std::vector<std::string> worked = WritesThrough(t.read_only_fd());
  EXPECT_TRUE(worked.empty()) << "changed through " << Joined(worked);
  uint32_t key = 0;
  MrView v{};
  v.addr = 0x1000;
  v.length = 4096;
  v.access = 1;
  ASSERT_EQ(t.Add(v, &key), 0);
  Mapping pod;
  ASSERT_EQ(MapRouterTable(t.read_only_fd(), kMrTableBytes, &pod), 0);
  MrView seen{};
  EXPECT_TRUE(ReadMrEntry(pod.as<MrEntry>(), key, &seen));
  EXPECT_EQ(seen.addr, 0x1000u);
}

}  // namespace
}  // namespace ff::router
