// Calling the libc function that an interposer of a preloaded library stands in front of:
// the next definition after this library (dlsym(RTLD_NEXT)), so that another preload
// further down the chain (rsocket's, a profiler's, the other freeflow library) still sees
// the call. Both libffverbs.so and libfsocket.so use this; neither calls a plain libc name
// it interposes for a descriptor it manages, which would come back to its own interposer.
#pragma once

#include <dlfcn.h>

#include <atomic>
#include <cerrno>
#include <type_traits>
#include <utility>

namespace ff::preload {

// The next definition of `name` after this library; nullptr when there is none.
inline void* Next(const char* name) { return ::dlsym(RTLD_NEXT, name); }

// Next(name), looked up once into `slot` (a race only looks it up twice).
template <typename Fn>
Fn ResolveNext(std::atomic<Fn>& slot, const char* name) {
  Fn fn = slot.load(std::memory_order_acquire);
  if (fn == nullptr) {
    fn = reinterpret_cast<Fn>(Next(name));
    if (fn != nullptr) slot.store(fn, std::memory_order_release);
  }
  return fn;
}

// Calls it; -1 (a null pointer for a function returning one) with ENOSYS when there is none
// (never on glibc).
template <typename Fn, typename... Args>
auto CallNext(std::atomic<Fn>& slot, const char* name, Args... args)
    -> decltype(std::declval<Fn>()(args...)) {
  using R = decltype(std::declval<Fn>()(args...));
  Fn fn = ResolveNext(slot, name);
  if (fn == nullptr) {
    errno = ENOSYS;
    if constexpr (std::is_pointer_v<R>) {
      return nullptr;
    } else {
      return static_cast<R>(-1);
    }
  }
  return fn(args...);
}

}  // namespace ff::preload
