#include "control/page_switch.h"

#include <dlfcn.h>
#include <errno.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

#include "base/log.h"
#include "freeflow/clock.h"

namespace ff::verbs {
namespace {

// The range of the move in progress, or of the last one.
std::atomic<uintptr_t> g_lo{0};
std::atomic<uintptr_t> g_hi{0};
// 1 while a move is in progress: the word held writers wait on.
std::atomic<uint32_t> g_moving{0};
// When the last move ended (CLOCK_MONOTONIC, ns). A write fault raised during a move may be
// delivered after it ended (the thread was preempted in between): within kStaleFaultNs of
// the end, a write fault in its range is taken for such a one and the write runs again. A
// genuine one (the program made those pages read-only itself and wrote) still ends in the
// program's own handling once that time is past.
std::atomic<uint64_t> g_ended_ns{0};
constexpr uint64_t kStaleFaultNs = 1'000'000'000;

// The SIGSEGV disposition the program had before ours.
struct sigaction g_prev;

void Futex(std::atomic<uint32_t>* word, int op, uint32_t value) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op | FUTEX_PRIVATE_FLAG, value, nullptr,
            nullptr, 0);
}

int Mprotect(uintptr_t start, size_t size, int prot) {
  return ::syscall(SYS_mprotect, start, size, prot) == 0 ? 0 : errno;
}

// libc's own sigaction. Programs replace the symbol (UCX's libucs defines `signal` and
// `sigaction` of its own, to keep its error handlers in place): ours must be in place, and
// theirs the one we pass faults on to.
int Sigaction(int sig, const struct sigaction* act, struct sigaction* old) {
  using Fn = int (*)(int, const struct sigaction*, struct sigaction*);
  static const Fn libc = [] {
    void* handle = ::dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
    void* sym = handle != nullptr ? ::dlsym(handle, "sigaction") : nullptr;
    return sym != nullptr ? reinterpret_cast<Fn>(sym) : &::sigaction;
  }();
  return libc(sig, act, old);
}

// A SIGSEGV that is not a held write: what the program would have had without us.
void PassOn(int sig, siginfo_t* info, void* context) {
  const struct sigaction prev = g_prev;
  if ((prev.sa_flags & SA_SIGINFO) != 0 && prev.sa_sigaction != nullptr) {
    prev.sa_sigaction(sig, info, context);
    return;
  }
  if (prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN) {
    prev.sa_handler(sig);
    return;
  }
  // The default action (a fault cannot be ignored): put it back; a fault then happens again
  // when the handler returns and takes it, a signal sent to the process is sent again.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  Sigaction(SIGSEGV, &dfl, nullptr);
  if (info->si_code <= 0) ::raise(SIGSEGV);
}

void OnSegv(int sig, siginfo_t* info, void* context) {
  const int saved = errno;
  const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
  const bool ours = info->si_code == SEGV_ACCERR && addr >= g_lo.load() && addr < g_hi.load();
  if (ours && g_moving.load(std::memory_order_acquire) != 0) {
    while (g_moving.load(std::memory_order_acquire) != 0) Futex(&g_moving, FUTEX_WAIT, 1);
    errno = saved;
    return;  // the write runs again, into the new pages
  }
  if (ours && ff::MonotonicNs() - g_ended_ns.load() < kStaleFaultNs) {
    errno = saved;
    return;
  }
  errno = saved;
  PassOn(sig, info, context);
}

// Puts OnSegv in place unless it is there (the program may have replaced it since).
bool Install() {
  struct sigaction cur;
  if (Sigaction(SIGSEGV, nullptr, &cur) != 0) return false;
  if ((cur.sa_flags & SA_SIGINFO) != 0 && cur.sa_sigaction == OnSegv) return true;
  struct sigaction ours {};
  ours.sa_sigaction = OnSegv;
  ours.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
  sigemptyset(&ours.sa_mask);
  g_prev = cur;
  if (Sigaction(SIGSEGV, &ours, nullptr) != 0) {
    LogError("cannot install the SIGSEGV handler that holds writes during page moves: %s",
             std::strerror(errno));
    return false;
  }
  return true;
}

// Whether [start, start+size) comes within kStackReach of the calling thread's stack.
bool NearOwnStack(uintptr_t start, size_t size) {
  constexpr uintptr_t kStackReach = 256 * 1024;
  const char probe = 0;
  const auto sp = reinterpret_cast<uintptr_t>(&probe);
  const uintptr_t lo = sp > kStackReach ? sp - kStackReach : 0;
  return start < sp + kStackReach && start + size > lo;
}

}  // namespace

PageSwitch::PageSwitch(uintptr_t start, size_t size) : start_(start), size_(size) {
  if (size == 0 || NearOwnStack(start, size) || !Install()) return;
  g_lo.store(start);
  g_hi.store(start + size);
  g_moving.store(1, std::memory_order_release);
  if (const int rc = Mprotect(start, size, PROT_READ)) {
    Mprotect(start, size, PROT_READ | PROT_WRITE);  // a part may have changed (ENOMEM)
    g_moving.store(0, std::memory_order_release);
    Futex(&g_moving, FUTEX_WAKE, INT32_MAX);
    LogError("cannot make pages read-only while they move: %s", std::strerror(rc));
    return;
  }
  protected_ = true;
}

PageSwitch::~PageSwitch() {
  if (!protected_) return;
  const int rc = mapped_ ? 0 : Mprotect(start_, size_, PROT_READ | PROT_WRITE);
  g_ended_ns.store(ff::MonotonicNs());
  g_moving.store(0, std::memory_order_release);
  Futex(&g_moving, FUTEX_WAKE, INT32_MAX);
  // Only now: logging may write to the heap, whose pages these may be.
  if (rc != 0)
    LogError("cannot make pages writable again after a failed move: %s", std::strerror(rc));
}

}  // namespace ff::verbs
