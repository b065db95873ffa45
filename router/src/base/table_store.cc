#include "base/table_store.h"

#include <fcntl.h>
#include <linux/mount.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace ff::router {
namespace {

std::string Failed(const char* what, int err) {
  return std::string(what) + ": " + std::strerror(err);
}

// A memfd of `bytes`, resizing sealed, and a read-only reopen of it for pods.
int SealedTable(const char* name, size_t bytes, UniqueFd* rw, UniqueFd* ro) {
  if (const int rc = CreateSegment(name, bytes, rw)) return rc;
  const std::string self = "/proc/self/fd/" + std::to_string(rw->get());
  ro->reset(::open(self.c_str(), O_RDONLY | O_CLOEXEC));
  return *ro ? 0 : errno;
}

}  // namespace

bool TableStore::OpenMounts() {
  if (tried_) return static_cast<bool>(ro_mount_);
  tried_ = true;
  UniqueFd fs(::fsopen("tmpfs", FSOPEN_CLOEXEC));
  if (!fs) {
    why_not_ = Failed("fsopen tmpfs", errno);
    return false;
  }
  // No size or inode limit of its own (0: none), as for memfds: a full tmpfs would turn the
  // router's next write into a table page into SIGBUS. Its pages are charged to the router's
  // memory cgroup, as memfd pages are.
  if (::fsconfig(fs.get(), FSCONFIG_SET_STRING, "mode", "0700", 0) != 0 ||
      ::fsconfig(fs.get(), FSCONFIG_SET_STRING, "size", "0", 0) != 0 ||
      ::fsconfig(fs.get(), FSCONFIG_SET_STRING, "nr_inodes", "0", 0) != 0 ||
      ::fsconfig(fs.get(), FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) != 0) {
    why_not_ = Failed("creating the tmpfs", errno);
    return false;
  }
  constexpr unsigned kAttrs = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC;
  UniqueFd rw(::fsmount(fs.get(), FSMOUNT_CLOEXEC, kAttrs));
  if (!rw) {
    why_not_ = Failed("fsmount", errno);
    return false;
  }
  UniqueFd ro(::open_tree(rw.get(), "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH));
  mount_attr attr{};
  attr.attr_set = MOUNT_ATTR_RDONLY;
  if (!ro || ::mount_setattr(ro.get(), "", AT_EMPTY_PATH, &attr, sizeof(attr)) != 0) {
    why_not_ = Failed("a read-only clone of the tmpfs", errno);
    return false;
  }
  rw_mount_ = std::move(rw);
  ro_mount_ = std::move(ro);
  return true;
}

int TableStore::Make(const char* name, size_t bytes, UniqueFd* rw, UniqueFd* ro, Mapping* map) {
  std::lock_guard<std::mutex> g(mu_);
  if (!OpenMounts()) {
    if (const int rc = SealedTable(name, bytes, rw, ro)) return rc;
    if (const int rc = MapSegment(rw->get(), bytes, true, map)) return rc;
    // Only the mapping above may write it: a pod that reopens its read-only descriptor
    // through /proc/self/fd still cannot map it writable.
    return SealReadOnly(rw->get());
  }
  const std::string file = std::string(name) + "-" + std::to_string(next_++);
  UniqueFd w(::openat(rw_mount_.get(), file.c_str(),
                      O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!w) return errno;
  UniqueFd r(::openat(ro_mount_.get(), file.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  const int err = !r ? errno : ::ftruncate(w.get(), static_cast<off_t>(bytes)) != 0 ? errno : 0;
  ::unlinkat(rw_mount_.get(), file.c_str(), 0);  // the descriptors keep it
  if (err != 0) return err;
  if (const int rc = MapSegment(w.get(), bytes, true, map)) return rc;
  *rw = std::move(w);
  *ro = std::move(r);
  return 0;
}

std::string TableStore::Adopt(int rw, int ro, size_t bytes, Mapping* map) {
  if (!RouterTableAtLeast(ro, bytes)) return "its read-only descriptor is not a router table";
  struct stat r {};
  struct stat w {};
  if (::fstat(ro, &r) != 0 || ::fstat(rw, &w) != 0 || r.st_dev != w.st_dev || r.st_ino != w.st_ino)
    return "its two descriptors are not the same file";
  if (MapSegment(rw, bytes, true, map) != 0)
    return "it cannot be mapped writable (a sealed memfd of an older router)";
  return "";
}

bool TableStore::movable() {
  std::lock_guard<std::mutex> g(mu_);
  return OpenMounts();
}

std::string TableStore::why_not() const {
  std::lock_guard<std::mutex> g(mu_);
  return why_not_;
}

TableStore& RouterTables() {
  static TableStore store;
  return store;
}

}  // namespace ff::router
