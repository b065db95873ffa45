// Certificates for tests: a new directory under /tmp filled by scripts/ff-certs.sh.
#pragma once

#include <stdlib.h>

#include <initializer_list>
#include <string>

namespace ff::testing {

// Runs `script` (scripts/ff-certs.sh) once per entry of `runs`, each entry its arguments
// with "DIR" standing for the new directory (e.g. "-i 127.0.0.1 DIR node localhost").
// Returns the directory, or "" when one run failed (the caller removes what was made).
inline std::string MakeTestCerts(const std::string& script,
                                 std::initializer_list<std::string> runs) {
  char tmpl[] = "/tmp/ff-test-certs-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return {};
  const std::string dir = tmpl;
  for (std::string args : runs) {
    for (auto at = args.find("DIR"); at != std::string::npos; at = args.find("DIR", at))
      args.replace(at, 3, dir);
    if (std::system(("bash '" + script + "' " + args + " >/dev/null").c_str()) != 0) return {};
  }
  return dir;
}

}  // namespace ff::testing
