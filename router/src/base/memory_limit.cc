#include "base/memory_limit.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

namespace ff::router {
namespace {

// cgroup v1 writes its "no limit" as the largest page-aligned counter (9223372036854771712);
// anything from 2^62 on is treated as none.
constexpr uint64_t kNoLimitFrom = uint64_t{1} << 62;

// A limit file's value: a number of bytes, or "max" (v2: none). std::nullopt for none, for a
// missing file and for anything else.
std::optional<uint64_t> ReadLimit(const std::filesystem::path& file) {
  std::ifstream in(file);
  std::string text;
  if (!in || !std::getline(in, text)) return std::nullopt;
  uint64_t value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end || value >= kNoLimitFrom) return std::nullopt;
  return value;
}

// The controllers of a /proc/self/cgroup line ("4:memory:/a/b" names memory; v2's "0::/a/b"
// none), and whether `name` is among them.
bool Names(std::string_view controllers, std::string_view name) {
  while (!controllers.empty()) {
    const size_t comma = controllers.find(',');
    if (controllers.substr(0, comma) == name) return true;
    if (comma == std::string_view::npos) break;
    controllers.remove_prefix(comma + 1);
  }
  return false;
}

}  // namespace

std::optional<uint64_t> CgroupMemoryLimit(std::string_view proc_self_cgroup,
                                          const std::string& cgroup_root) {
  namespace fs = std::filesystem;
  std::optional<std::string> v1_path;
  std::optional<std::string> v2_path;
  std::istringstream lines{std::string(proc_self_cgroup)};
  for (std::string line; std::getline(lines, line);) {
    const size_t first = line.find(':');
    const size_t second = first == std::string::npos ? first : line.find(':', first + 1);
    if (second == std::string::npos) continue;
    const std::string_view id = std::string_view(line).substr(0, first);
    const std::string_view controllers =
        std::string_view(line).substr(first + 1, second - first - 1);
    const std::string path = line.substr(second + 1);
    if (Names(controllers, "memory")) v1_path = path;
    if (id == "0" && controllers.empty()) v2_path = path;
  }
  fs::path mount;
  std::string path;
  const char* file = nullptr;
  if (v1_path) {
    mount = fs::path(cgroup_root) / "memory";
    path = *v1_path;
    file = "memory.limit_in_bytes";
  } else if (v2_path) {
    mount = fs::path(cgroup_root);
    path = *v2_path;
    file = "memory.max";
  } else {
    return std::nullopt;
  }
  // The cgroup's folder and each ancestor up to the mount; the kernel's path has no "..".
  if (path.find("..") != std::string::npos) return std::nullopt;
  std::error_code ec;
  fs::path dir = mount / fs::path(path).relative_path();
  if (!fs::is_directory(dir, ec)) dir = mount;
  std::optional<uint64_t> limit;
  for (fs::path d = dir;; d = d.parent_path()) {
    if (const auto l = ReadLimit(d / file)) limit = limit ? std::min(*limit, *l) : *l;
    if (d == mount || d.parent_path() == d || d.native().size() <= mount.native().size()) break;
  }
  return limit;
}

std::optional<uint64_t> ProcessMemoryLimit() {
  std::ifstream in("/proc/self/cgroup");
  std::stringstream text;
  text << in.rdbuf();
  return CgroupMemoryLimit(text.str(), "/sys/fs/cgroup");
}

}  // namespace ff::router
