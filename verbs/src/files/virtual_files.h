// The process's virtual tree (virtual_tree.h) served through libc: where a path-based call
// fails because the real file system has nothing there (ENOENT, or ENOTDIR for a path
// relative to a directory descriptor of the tree), the tree answers as a read-only file
// system would. A real file always wins: the call goes to libc first.
//
// What answers: the open family (cm_device.cc's interposers call TryOpen), fopen, the stat
// and access families (device_files.cc calls TryStat, TryStatx, TryAccess), the directory
// streams (opendir, fdopendir, readdir, scandir, ...), readlink and realpath (all in
// virtual_files.cc). A file opens as a sealed, read-only memory file holding its content; a
// directory as a descriptor the library recognises for openat, fstatat and fdopendir. Raw
// system calls (static binaries, Go programs) and calls made inside libc (nftw, glob) see
// nothing; docs/verbs-library.md lists them.
//
// The tree is built on the first call that needs it (a path under one of its roots that the
// file system lacks), by the builder the sysfs view installs (views/sysfs_view.h); a failed
// build is tried again on the next such call.
#pragma once

#include <sys/stat.h>

#include <memory>
#include <string>
#include <vector>

#include "files/virtual_tree.h"

namespace ff::verbs::vfs {

// Builds the tree (nullptr: nothing to serve now, e.g. no router). `roots` are the absolute
// folders it may hold something under; a path outside them is never looked up, so a
// program that probes other missing paths never makes the tree be built.
using Builder = std::shared_ptr<const Tree> (*)();
void SetBuilder(Builder builder, std::vector<std::string> roots);

// Forgets the built tree (tests; the next call builds it again).
void ResetServed();

// The served tree, built if needed; nullptr when there is none.
std::shared_ptr<const Tree> Served();

// After the real call failed with `err`: whether the tree answers for (dirfd, path); if so,
// the answer is in *result (and errno, when it is -1). False leaves errno alone.
bool TryOpen(int err, int dirfd, const char* path, int flags, int* result);
bool TryStat(int err, int dirfd, const char* path, bool follow, struct stat* st, int* result);
bool TryStat(int err, int dirfd, const char* path, bool follow, struct stat64* st, int* result);
bool TryStatx(int err, int dirfd, const char* path, int flags, struct statx* sx, int* result);
bool TryAccess(int err, int dirfd, const char* path, int mode, int* result);

// fstat of a directory descriptor of the tree (after the real fstat succeeded on it).
bool FstatDir(int fd, struct stat* st);
bool FstatDir(int fd, struct stat64* st);

// For the other interposers of this folder (dir_streams.cc, paths.cc).
struct Hit {
  std::shared_ptr<const Tree> tree;
  Found found;
};
enum class Answer { kNotOurs, kFound, kFailed };
// After the real call failed with `err`: what the tree has at (dirfd, path). kFailed sets
// *fail (an error inside the tree: ENOTDIR, ELOOP); an absolute path the tree lacks is
// kNotOurs, so the real call's answer stands.
Answer Lookup(int err, int dirfd, const char* path, bool follow, Hit* hit, int* fail);
// A new descriptor for a directory of the tree, recognised by DirOfFd (-1 and errno).
int OpenDirFd(const Hit& dir, bool cloexec);
// The directory a descriptor of OpenDirFd stands for, if `fd` is still one.
bool DirOfFd(int fd, Hit* dir);

// A path argument as the interposers pass it on: a relative one, while the working
// directory is a directory of the tree (chdir into it, paths.cc), is made absolute first,
// since the process's real working directory is still the one before; otherwise unchanged.
class PathArg {
 public:
  PathArg(int dirfd, const char* path);
  int dirfd() const { return dirfd_; }
  const char* path() const { return path_; }

 private:
  int dirfd_;
  const char* path_;
  std::string abs_;
};

// The working directory inside the tree (chdir, fchdir, getcwd in paths.cc): set to a
// directory of it, or cleared when a real chdir succeeds. `*cwd` is its path, if set.
void SetVirtualCwd(const Hit& dir);
void ClearVirtualCwd();
bool VirtualCwd(std::string* cwd);

}  // namespace ff::verbs::vfs
