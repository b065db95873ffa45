// Included by every file that defines libibverbs entry points. verbs.h turns a few of them
// into macros that call inline wrappers; the library must define the real symbols.
//
// The one place where the internal error convention (0 or a positive errno, see internal.h)
// meets the verbs' own: each entry point runs its body through Guarded(), so that no
// exception reaches C code, and converts the result the way its verb defines (NULL + errno,
// the errno returned, or -1 + errno).
#pragma once

#include <cerrno>
#include <new>

#include "base/objects.h"

#undef ibv_get_device_list
#undef ibv_query_port
#undef ibv_reg_mr
#undef ibv_reg_mr_iova

#define FFV_EXPORT __attribute__((visibility("default")))

namespace ff::verbs {

// Runs `body` (returns 0 or a positive errno). Only allocation can throw inside the library.
template <typename F>
int Guarded(F&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return ENOMEM;
  } catch (...) {
    return EIO;
  }
}

// For verbs that return an object, or NULL with errno set.
template <typename T>
T* ObjectOrNull(int rc, T* object) {
  if (rc != 0) {
    errno = rc;
    return nullptr;
  }
  return object;
}

// For verbs that return 0, or -1 with errno set.
inline int ZeroOrMinusOne(int rc) {
  if (rc == 0) return 0;
  errno = rc;
  return -1;
}

// The vctx->create_qp_ex operation (qp.cc).
ibv_qp* CreateQpEx(ibv_context* context, ibv_qp_init_attr_ex* attr);

}  // namespace ff::verbs
