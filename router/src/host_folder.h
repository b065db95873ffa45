// The node's shared folder (/freeflow by default), mounted into pods: the router's socket
// lives there and the container library is installed there. One router serves one socket
// name in it, enforced by a lock file.
#pragma once

#include <string>

#include "freeflow/fd.h"

namespace ff::router {

class HostFolder {
 public:
  // Checks that `dir` is a writable directory, takes <dir>/<name>.lock and installs
  // `library_source` (empty: skip) as <dir>/libffverbs.so. false + *error (a sentence a
  // person can act on) when any step fails.
  bool Take(const std::string& dir, const std::string& name, const std::string& library_source,
            std::string* error);
  std::string socket_path() const { return dir_ + "/" + name_ + ".sock"; }

 private:
  bool InstallLibrary(const std::string& source, std::string* error);

  std::string dir_;
  std::string name_;
  UniqueFd lock_;
};

}  // namespace ff::router
