#include "base/fd_marks.h"

namespace ff::verbs {

constinit FdMarks g_library_fds;

}  // namespace ff::verbs
