// What a test reads of its own process's open files.
#pragma once

#include <dirent.h>
#include <unistd.h>

#include <string>

namespace fftest {

// How many of this process's descriptors are files whose name starts with `prefix`, as
// /proc/self/fd shows them (a memfd: "/memfd:NAME (deleted)"); -1 when it cannot be read.
inline int DescriptorsNamed(const std::string& prefix) {
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return -1;
  int found = 0;
  while (const dirent* e = ::readdir(d)) {
    char target[256] = {};
    const std::string link = std::string("/proc/self/fd/") + e->d_name;
    if (::readlink(link.c_str(), target, sizeof(target) - 1) > 0 &&
        std::string(target).rfind(prefix, 0) == 0)
      ++found;
  }
  ::closedir(d);
  return found;
}

}  // namespace fftest
