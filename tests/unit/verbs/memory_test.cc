// Memory registration and what the router is given of it: nothing for memory without remote
// access, a memfd sealed read-only for memory peers may only read, a writable one for memory
// they may write, and pages that move between them as registrations come and go.
#include <dlfcn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

#include "pod.h"

// Stand-ins for a program's hooks on libc's mapping functions, as UCX's libucm installs
// them (its mremap takes four arguments and loses MREMAP_FIXED's target). They forward to
// libc; while a range is watched they count calls that name an address in it, and refuse
// every MREMAP_FIXED (EINVAL, what UCM's lost target gave). The library must not need them.
namespace {
std::atomic<uintptr_t> g_watch_lo{0};
std::atomic<uintptr_t> g_watch_hi{0};
std::atomic<int> g_hooked{0};

bool Watched(const void* addr) {
  const auto a = reinterpret_cast<uintptr_t>(addr);
  return a >= g_watch_lo.load() && a < g_watch_hi.load();
}

template <typename Fn>
Fn Libc(const char* name) {
  return reinterpret_cast<Fn>(::dlsym(RTLD_NEXT, name));
}
}  // namespace

extern "C" void* mmap(void* addr, size_t len, int prot, int flags, int fd, off_t off) noexcept {
  using Fn = void* (*)(void*, size_t, int, int, int, off_t);
  static const Fn real = Libc<Fn>("mmap");
  if (Watched(addr)) ++g_hooked;
  return real(addr, len, prot, flags, fd, off);
}

extern "C" int munmap(void* addr, size_t len) noexcept {
  using Fn = int (*)(void*, size_t);
  static const Fn real = Libc<Fn>("munmap");
  if (Watched(addr)) ++g_hooked;
  return real(addr, len);
}

extern "C" void* mremap(void* old, size_t old_len, size_t new_len, int flags, ...) noexcept {
  using Fn = void* (*)(void*, size_t, size_t, int, ...);
  static const Fn real = Libc<Fn>("mremap");
  void* to = nullptr;
  if (flags & MREMAP_FIXED) {
    va_list ap;
    va_start(ap, flags);
    to = va_arg(ap, void*);
    va_end(ap);
    if (g_watch_hi.load() != 0) {
      ++g_hooked;
      errno = EINVAL;
      return MAP_FAILED;
    }
  }
  if (Watched(old) || Watched(to)) ++g_hooked;
  return real(old, old_len, new_len, flags, to);
}

namespace fftest {
namespace {

size_t Page() { return static_cast<size_t>(::sysconf(_SC_PAGESIZE)); }

// Page-aligned private memory the test registers itself.
class Area {
 public:
  explicit Area(size_t pages) : bytes_(pages * Page()) {
    void* p = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      ADD_FAILURE() << "mmap: " << std::strerror(errno);
      return;
    }
    data_ = static_cast<char*>(p);
  }
  ~Area() {
    if (data_ != nullptr) ::munmap(data_, bytes_);
  }
  Area(const Area&) = delete;
  Area& operator=(const Area&) = delete;
  char* data() const { return data_; }
  size_t size() const { return bytes_; }

 private:
  char* data_ = nullptr;
  size_t bytes_ = 0;
};

// The line of /proc/self/maps that covers `addr` ("" when none does).
std::string MappingOf(const void* addr) {
  const auto a = reinterpret_cast<uintptr_t>(addr);
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx", &lo, &hi) == 2 && a >= lo && a < hi) return line;
  }
  return "";
}

// True when the mapping that covers `addr` is shared memory of a memfd (a region).
bool InARegion(const void* addr) {
  const std::string line = MappingOf(addr);
  const size_t perms = line.find(' ');
  return perms != std::string::npos && line.size() > perms + 4 && line[perms + 4] == 's' &&
         line.find("/memfd:") != std::string::npos;
}

int Seals(int fd) { return ::fcntl(fd, F_GET_SEALS); }

TEST(Memory, ALocalOnlyRegistrationHasNoRegionAndItsPagesStayPrivate) {
  Pod pod;
  Area area(2);
  std::memset(area.data(), 'l', area.size());
  ibv_mr* mr = ibv_reg_mr(pod.pd, area.data(), area.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr) << std::strerror(errno);
  const ff::MrEntry* e = pod.router.mr_entry(mr->lkey);
  EXPECT_EQ(e->key.load(), mr->lkey);
  EXPECT_EQ(e->region.load(), ff::proto::kNoRegion);
  EXPECT_EQ(e->access.load(), static_cast<uint32_t>(IBV_ACCESS_LOCAL_WRITE));
  EXPECT_EQ(e->length.load(), area.size());
  EXPECT_EQ(pod.router.regions_received(), 0) << "the router was given memory of its own";
  EXPECT_FALSE(InARegion(area.data())) << MappingOf(area.data());
  EXPECT_EQ(area.data()[area.size() - 1], 'l');

  // The same pages registered for remote reads do go into a region: the check above can fail.
  ibv_mr* shared = ibv_reg_mr(pod.pd, area.data(), area.size(), IBV_ACCESS_REMOTE_READ);
  ASSERT_NE(shared, nullptr) << std::strerror(errno);
  EXPECT_EQ(pod.router.regions_received(), 1);
  EXPECT_TRUE(InARegion(area.data())) << MappingOf(area.data());
  EXPECT_EQ(area.data()[area.size() - 1], 'l');
  EXPECT_EQ(ibv_dereg_mr(shared), 0);
  EXPECT_FALSE(InARegion(area.data())) << "deregistration gives the pages back";

  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  EXPECT_EQ(e->key.load(), 0u) << "the router did not hear of the deregistration";
}

TEST(Memory, AReadOnlyRegionIsSealedMovesOutForAWriteRegistrationAndBackWhenItLeaves) {
  Pod pod;
  Area area(2);
  char* p = area.data();
  const size_t bytes = area.size();
  std::memset(p, 'a', bytes);
  ibv_mr* rd = ibv_reg_mr(pod.pd, p, bytes, IBV_ACCESS_REMOTE_READ);
  ASSERT_NE(rd, nullptr) << std::strerror(errno);
  const ff::MrEntry* rd_entry = pod.router.mr_entry(rd->lkey);
  const uint32_t sealed = rd_entry->region.load();
  ASSERT_NE(sealed, ff::proto::kNoRegion);
  const int sealed_fd = pod.router.region_fd(sealed);
  ASSERT_GE(sealed_fd, 0);
  EXPECT_NE(Seals(sealed_fd) & F_SEAL_FUTURE_WRITE, 0) << "reads only, yet writable by peers";
  EXPECT_NE(Seals(sealed_fd) & F_SEAL_SHRINK, 0);
  errno = 0;
  EXPECT_EQ(::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, sealed_fd, 0), MAP_FAILED);
  EXPECT_EQ(errno, EPERM);
  ff::Mapping seen;  // what a peer that reads sees
  ASSERT_EQ(ff::MapSegment(sealed_fd, bytes, false, &seen), 0);
  EXPECT_EQ(seen.as<char>()[bytes - 1], 'a');
  p[10] = 'b';  // the application still writes its own buffer
  EXPECT_EQ(seen.as<char>()[10], 'b');

  // A registration that grants writes over the same pages: they move to a writable region.
  ibv_mr* wr = ibv_reg_mr(pod.pd, p + 100, 1000, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ASSERT_NE(wr, nullptr) << std::strerror(errno);
  EXPECT_EQ(pod.router.move_mr_count(), 1);
  const uint32_t writable = rd_entry->region.load();
  EXPECT_NE(writable, sealed);
  EXPECT_EQ(pod.router.last_moved_region(), writable);
  EXPECT_EQ(pod.router.mr_entry(wr->lkey)->region.load(), writable);
  const int writable_fd = pod.router.region_fd(writable);
  ASSERT_GE(writable_fd, 0);
  EXPECT_EQ(Seals(writable_fd) & (F_SEAL_FUTURE_WRITE | F_SEAL_WRITE), 0);
  ff::Mapping peer;  // what a peer that writes maps
  ASSERT_EQ(ff::MapSegment(writable_fd, bytes, true, &peer), 0);
  EXPECT_EQ(peer.as<char>()[10], 'b') << "the contents moved with the pages";
  peer.as<char>()[200] = 'c';
  EXPECT_EQ(p[200], 'c') << "the writable region does not back the application's buffer";

  // The last registration that grants writes leaves: the pages move to a fresh sealed region,
  // and the writable memfd peers may still hold no longer reaches them.
  EXPECT_EQ(ibv_dereg_mr(wr), 0);
  EXPECT_EQ(pod.router.move_mr_count(), 2);
  const uint32_t resealed = rd_entry->region.load();
  EXPECT_NE(resealed, writable);
  EXPECT_NE(resealed, sealed);
  const int resealed_fd = pod.router.region_fd(resealed);
  ASSERT_GE(resealed_fd, 0);
  EXPECT_NE(Seals(resealed_fd) & F_SEAL_FUTURE_WRITE, 0);
  peer.as<char>()[300] = 'X';
  EXPECT_NE(p[300], 'X') << "a peer still writes the application's memory after the revoke";
  p[400] = 'd';
  ff::Mapping now;
  ASSERT_EQ(ff::MapSegment(resealed_fd, bytes, false, &now), 0);
  EXPECT_EQ(now.as<char>()[400], 'd');
  EXPECT_EQ(now.as<char>()[200], 'c');
  EXPECT_EQ(ibv_dereg_mr(rd), 0);
}

TEST(Memory, RemapsBypassHooksOnLibcsMappingFunctions) {
  Pod pod;
  Area area(3);
  std::memset(area.data(), 'h', area.size());
  g_hooked = 0;
  g_watch_lo = reinterpret_cast<uintptr_t>(area.data());
  g_watch_hi = g_watch_lo + area.size();
  ibv_mr* mr =
      ibv_reg_mr(pod.pd, area.data() + 10, 5000, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ASSERT_NE(mr, nullptr) << std::strerror(errno);
  EXPECT_TRUE(InARegion(area.data())) << MappingOf(area.data());
  const int region_fd = pod.router.region_fd(pod.router.mr_entry(mr->lkey)->region.load());
  ASSERT_GE(region_fd, 0);
  ff::Mapping peer;  // what a peer that writes maps
  ASSERT_EQ(ff::MapSegment(region_fd, 2 * Page(), true, &peer), 0);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  g_watch_hi = 0;
  EXPECT_EQ(g_hooked.load(), 0) << "the library's remaps went through hookable libc functions";
  EXPECT_FALSE(InARegion(area.data())) << "the pages stayed shared after deregistration";
  peer.as<char>()[100] = 'X';
  EXPECT_EQ(area.data()[100], 'h') << "a peer mapping still reaches the pages after dereg";
  EXPECT_EQ(area.data()[2 * Page() - 1], 'h');
}

// The pages at a registration's ends hold whatever else the program keeps there (malloc's
// headers, a librdmacm id's mutex and event count). Registration and deregistration move
// those pages (a copy, then the copy mapped over them): a write another thread made to them
// meanwhile used to be lost, which left rping's rdma_destroy_id waiting for an event count
// that had gone back by one, or for a mutex that looked held. Here a thread counts in the
// first and last words of the pages while the main thread registers and deregisters the
// middle of them; every count must be there at the end.
TEST(Memory, WritesBesideARegistrationSurviveItsRegistrationAndDeregistration) {
  Pod pod;
  Area area(3);
  auto* head = reinterpret_cast<std::atomic<uint64_t>*>(area.data());
  auto* tail = reinterpret_cast<std::atomic<uint64_t>*>(area.data() + area.size() - 8);
  std::atomic<bool> stop{false};
  uint64_t counted = 0;
  std::thread writer([&] {
    while (!stop.load(std::memory_order_relaxed)) {
      head->fetch_add(1, std::memory_order_relaxed);
      tail->store(tail->load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
      ++counted;
    }
  });
  constexpr int kRounds = 300;
  int registered = 0;
  for (int i = 0; i < kRounds; ++i) {
    const unsigned access =
        (i % 2 == 0) ? IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE : IBV_ACCESS_REMOTE_READ;
    ibv_mr* mr = ibv_reg_mr(pod.pd, area.data() + 64, area.size() - 128, access);
    if (mr == nullptr) {
      ADD_FAILURE() << "ibv_reg_mr: " << std::strerror(errno);
      break;
    }
    ++registered;
    EXPECT_EQ(ibv_dereg_mr(mr), 0);
  }
  stop = true;
  writer.join();
  EXPECT_EQ(registered, kRounds);
  EXPECT_GT(counted, 0u);
  EXPECT_EQ(head->load(), counted) << "atomic increments beside the registration were lost";
  EXPECT_EQ(tail->load(), counted) << "plain stores beside the registration were lost";
  EXPECT_FALSE(InARegion(area.data())) << MappingOf(area.data());
}

// The handler that holds those writes stays installed after a move, and every fault that
// is not a held write reaches the handler the program had: here one that jumps back out of
// a write to a page the test made inaccessible.
sigjmp_buf g_fault_jump;
std::atomic<int> g_program_faults{0};
void ProgramHandler(int, siginfo_t*, void*) {
  ++g_program_faults;
  siglongjmp(g_fault_jump, 1);
}

TEST(Memory, FaultsThatAreNotHeldWritesReachTheProgramsOwnHandler) {
  struct sigaction mine {};
  mine.sa_sigaction = ProgramHandler;
  mine.sa_flags = SA_SIGINFO;
  sigemptyset(&mine.sa_mask);
  struct sigaction before {};
  ASSERT_EQ(::sigaction(SIGSEGV, &mine, &before), 0);
  Area forbidden(1);  // mapped first: not where the registration's pages were
  {
    Pod pod;
    Area area(2);
    ibv_mr* mr = ibv_reg_mr(pod.pd, area.data(), area.size(), IBV_ACCESS_REMOTE_READ);
    ASSERT_NE(mr, nullptr) << std::strerror(errno);
    EXPECT_EQ(ibv_dereg_mr(mr), 0);
  }
  ASSERT_EQ(::mprotect(forbidden.data(), forbidden.size(), PROT_NONE), 0);
  g_program_faults = 0;
  if (sigsetjmp(g_fault_jump, 1) == 0) {
    *reinterpret_cast<volatile char*>(forbidden.data()) = 1;
    ADD_FAILURE() << "a write to an inaccessible page did not fault";
  }
  EXPECT_EQ(g_program_faults.load(), 1);
  ::sigaction(SIGSEGV, &before, nullptr);
}

}  // namespace
}  // namespace fftest
