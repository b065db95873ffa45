// What a build of freeflow is: the project's version and the git commit it was built from.
// Both are written at build time (cmake/version.cmake writes version.cc from
// core/src/version.cc.in on every build, and only when they changed), so a new commit
// recompiles one file and relinks the binaries that print them.
#pragma once

#include <string>
#include <string_view>

namespace ff {

// CMake's PROJECT_VERSION, e.g. "0.1.0".
const char* Version();
// The commit's short hash, with "-dirty" when tracked files differed from it at build time;
// "unknown" when the tree was not built from a git checkout.
const char* Commit();

// What a binary's --version prints: "PROGRAM VERSION (commit COMMIT)".
inline std::string VersionLine(std::string_view program) {
  std::string line(program);
  line.append(" ").append(Version()).append(" (commit ").append(Commit()).append(")");
  return line;
}

}  // namespace ff
