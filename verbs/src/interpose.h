// Calling the libc function that an interposer of the preloaded library stands in front of:
// the next definition after this library (dlsym(RTLD_NEXT)), so that another preload
// further down the chain (rsocket's, a profiler's) still sees the call.
#pragma once

#include <dlfcn.h>

#include <atomic>
#include <cerrno>
#include <utility>

namespace ffv {

// The next definition of `name`, looked up once into `slot` (a race only looks it up
// twice); nullptr when there is none.
template <typename Fn>
Fn ResolveReal(std::atomic<Fn>& slot, const char* name) {
  Fn fn = slot.load(std::memory_order_acquire);
  if (fn == nullptr) {
    fn = reinterpret_cast<Fn>(::dlsym(RTLD_NEXT, name));
    if (fn != nullptr) slot.store(fn, std::memory_order_release);
  }
  return fn;
}

// Calls it; -1 with ENOSYS when there is none.
template <typename Fn, typename... Args>
auto CallReal(std::atomic<Fn>& slot, const char* name, Args... args)
    -> decltype(std::declval<Fn>()(args...)) {
  Fn fn = ResolveReal(slot, name);
  if (fn == nullptr) {
    errno = ENOSYS;
    return -1;
  }
  return fn(args...);
}

}  // namespace ffv
