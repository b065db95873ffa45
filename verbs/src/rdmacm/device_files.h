// The device node that programs check before they use a device. libibverbs itself never
// looks at /dev/infiniband/<dev_name> for freeflow's device (the library opens no file),
// but UCX does: uct_ib_device_is_accessible() drops every device whose node is not a
// character device it may read and write. A pod has no such file and must not need
// privileges or a host mount for one, so the library answers stat() and access() of that
// one path in-process (device_files.cc), once this process has the device.
#pragma once

#include <sys/stat.h>

#include <string>

namespace ff::verbs {

// "/dev/infiniband/" + dev_name: where libibverbs' uverbs node of a device lives.
std::string DeviceNodePath(const char* dev_name);

// From now on, the stat and access families answer for `path` (absolute) as for a
// character device 231:192 with mode 0666, whenever the real call fails with ENOENT;
// a real file there always wins. Thread-safe; the last call wins.
void ServeDeviceNode(const std::string& path);

// From now on, /dev/infiniband/rdma_cm answers likewise as the character device 10:58
// (cm_device.h), when the real call fails with ENOENT. Set once this process has a router.
void ServeCmNode();

// Stops answering for both (tests).
void StopServingDeviceNode();

}  // namespace ff::verbs

// The stat wrappers of glibc < 2.33, which programs built against it call instead of stat,
// lstat and fstatat; newer headers no longer declare them (x86-64's glibc still exports
// them). The library defines them (device_files.cc).
extern "C" {
int __xstat(int ver, const char* path, struct stat* buf) noexcept;
int __xstat64(int ver, const char* path, struct stat64* buf) noexcept;
int __lxstat(int ver, const char* path, struct stat* buf) noexcept;
int __lxstat64(int ver, const char* path, struct stat64* buf) noexcept;
int __fxstatat(int ver, int dirfd, const char* path, struct stat* buf, int flags) noexcept;
int __fxstatat64(int ver, int dirfd, const char* path, struct stat64* buf, int flags) noexcept;
int __fxstat(int ver, int fd, struct stat* buf) noexcept;
int __fxstat64(int ver, int fd, struct stat64* buf) noexcept;
}
