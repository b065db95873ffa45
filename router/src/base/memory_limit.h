// The memory limit the kernel holds the router to: the smallest limit of its memory cgroup
// and the cgroup's ancestors (cgroup v2's memory.max, v1's memory.limit_in_bytes), which a
// container runtime sets from the container's resources.limits.memory. The router fits its
// per-pod byte quotas to it (FitMemoryQuotas, options.h) as it fits the descriptor quota to
// its RLIMIT_NOFILE.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace ff::router {

// The limit for a process whose /proc/self/cgroup reads `proc_self_cgroup`, with the cgroup
// file systems mounted under `cgroup_root` (normally /sys/fs/cgroup): v1's memory controller
// when a line names it (a hybrid host), else v2's unified hierarchy. In a container without
// its own cgroup namespace the path the kernel names is not under the container's mount, whose
// root is then the container's cgroup itself. std::nullopt: no limit, or none readable.
std::optional<uint64_t> CgroupMemoryLimit(std::string_view proc_self_cgroup,
                                          const std::string& cgroup_root);

// The limit of this process (/proc/self/cgroup under /sys/fs/cgroup).
std::optional<uint64_t> ProcessMemoryLimit();

}  // namespace ff::router
