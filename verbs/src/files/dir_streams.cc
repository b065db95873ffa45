// Directory streams of the virtual tree (virtual_files.h): opendir and fdopendir of one of
// its directories return a stream of the library's, and every other call of the family
// tells the library's streams from libc's by their address. A stream lists ".", ".." and
// the directory's entries in name order, with the tree's inode numbers and d_type; its
// dirfd is a directory descriptor of the tree, made on first use.
//
// scandir is answered here too: libc's calls its own opendir, which the library cannot see.
#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "base/exports.h"
#include "files/virtual_files.h"
#include "freeflow/preload/interpose.h"

// On x86-64 and aarch64 the two layouts are one; a stream hands out the same entry as both.
static_assert(sizeof(dirent) == sizeof(dirent64) &&
              offsetof(dirent, d_name) == offsetof(dirent64, d_name));

namespace ff::verbs::vfs {
namespace {

struct Stream {
  Hit dir;
  std::vector<dirent64> entries;
  size_t pos = 0;
  int fd = -1;  // owned; -1 until dirfd() or fdopendir gives one
};

std::mutex g_mu;
// Never destroyed: the interposers may run during exit, after static destructors.
std::unordered_set<const void*>& g_streams = *new std::unordered_set<const void*>;
std::atomic<int> g_stream_count{0};

Stream* Ours(DIR* d) {
  if (d == nullptr || g_stream_count.load(std::memory_order_acquire) == 0) return nullptr;
  std::lock_guard<std::mutex> l(g_mu);
  return g_streams.count(d) != 0 ? reinterpret_cast<Stream*>(d) : nullptr;
}

unsigned char TypeOf(Kind k) {
  switch (k) {
    case Kind::kDir:
      return DT_DIR;
    case Kind::kFile:
      return DT_REG;
    case Kind::kLink:
      return DT_LNK;
  }
  return DT_UNKNOWN;
}

dirent64 Entry(const std::string& name, uint64_t ino, unsigned char type, size_t index) {
  dirent64 e{};
  e.d_ino = ino;
  e.d_off = static_cast<off64_t>(index + 1);
  e.d_reclen = sizeof(dirent64);
  e.d_type = type;
  std::strncpy(e.d_name, name.c_str(), sizeof(e.d_name) - 1);
  return e;
}

std::vector<dirent64> Entries(const Hit& dir) {
  const Node& n = *dir.found.node;
  std::vector<dirent64> out;
  const std::string& path = dir.found.path;
  const size_t slash = path.rfind('/');
  const Node* parent = dir.tree->At(slash == 0 ? "/" : path.substr(0, slash));
  out.push_back(Entry(".", n.ino, DT_DIR, 0));
  out.push_back(Entry("..", parent != nullptr ? parent->ino : n.ino, DT_DIR, 1));
  for (const auto& [name, kind] : n.children) {
    const Node* child = dir.tree->At(JoinPath(path, name));
    out.push_back(Entry(name, child != nullptr ? child->ino : 0, TypeOf(kind), out.size()));
  }
  return out;
}

DIR* NewStream(const Hit& dir, int fd) {
  auto s = std::make_unique<Stream>();
  s->dir = dir;
  s->entries = Entries(dir);
  s->fd = fd;
  std::lock_guard<std::mutex> l(g_mu);
  g_streams.insert(s.get());
  g_stream_count.store(static_cast<int>(g_streams.size()), std::memory_order_release);
  return reinterpret_cast<DIR*>(s.release());
}

void DeleteStream(Stream* s) {
  {
    std::lock_guard<std::mutex> l(g_mu);
    g_streams.erase(s);
    g_stream_count.store(static_cast<int>(g_streams.size()), std::memory_order_release);
  }
  if (s->fd >= 0) ::close(s->fd);
  delete s;
}

// opendir's answer for a directory of the tree (nullptr and errno set; `*ours` false when
// the tree has nothing there).
DIR* OpenStream(int err, const char* path, bool* ours) {
  Hit hit;
  int fail = 0;
  const Answer a = Lookup(err, AT_FDCWD, path, true, &hit, &fail);
  *ours = a != Answer::kNotOurs;
  if (a == Answer::kNotOurs) return nullptr;
  if (a == Answer::kFailed || hit.found.node->kind != Kind::kDir) {
    errno = a == Answer::kFailed ? fail : ENOTDIR;
    return nullptr;
  }
  DIR* d = nullptr;
  if (Guarded([&] {
        d = NewStream(hit, -1);
        return 0;
      }) != 0)
    errno = ENOMEM;
  return d;
}

dirent64* Next(Stream* s) {
  if (s->pos >= s->entries.size()) return nullptr;  // the end: errno untouched
  return &s->entries[s->pos++];
}

template <typename Ent>
int NextInto(Stream* s, Ent* entry, Ent** result) {
  const dirent64* e = Next(s);
  if (e == nullptr) {
    *result = nullptr;
    return 0;
  }
  std::memcpy(entry, e, sizeof(*e));
  *result = entry;
  return 0;
}

// scandir over a stream of the tree: each entry malloc'ed, as libc's are.
template <typename Ent>
int Scan(Stream* s, Ent*** list, int (*filter)(const Ent*),
         int (*compar)(const Ent**, const Ent**)) {
  std::vector<Ent*> kept;
  for (const dirent64* e = Next(s); e != nullptr; e = Next(s)) {
    const auto* as = reinterpret_cast<const Ent*>(e);
    if (filter != nullptr && filter(as) == 0) continue;
    auto* copy = static_cast<Ent*>(std::malloc(sizeof(Ent)));
    if (copy == nullptr) {
      for (Ent* k : kept) std::free(k);
      errno = ENOMEM;
      return -1;
    }
    std::memcpy(copy, as, sizeof(Ent));
    kept.push_back(copy);
  }
  auto** out = static_cast<Ent**>(std::malloc((kept.size() + 1) * sizeof(Ent*)));
  if (out == nullptr) {
    for (Ent* k : kept) std::free(k);
    errno = ENOMEM;
    return -1;
  }
  std::copy(kept.begin(), kept.end(), out);
  if (compar != nullptr) {
    std::qsort(out, kept.size(), sizeof(Ent*),
               reinterpret_cast<int (*)(const void*, const void*)>(compar));
  }
  *list = out;
  return static_cast<int>(kept.size());
}

template <typename Ent, typename Fn>
int ScanDir(std::atomic<Fn>& real, const char* name, const char* path_arg, Ent*** list,
            int (*filter)(const Ent*), int (*compar)(const Ent**, const Ent**)) {
  const PathArg p(AT_FDCWD, path_arg);
  const char* const path = p.path();
  const int saved = errno;
  const int n = ff::preload::CallNext(real, name, path, list, filter, compar);
  if (n >= 0) return n;
  const int err = errno;
  bool ours = false;
  errno = saved;
  DIR* d = OpenStream(err, path, &ours);
  if (!ours) {
    errno = err;
    return n;
  }
  if (d == nullptr) return -1;
  Stream* s = reinterpret_cast<Stream*>(d);
  const int rc = Scan(s, list, filter, compar);
  const int e = errno;
  DeleteStream(s);
  errno = e;
  return rc;
}

}  // namespace
}  // namespace ff::verbs::vfs

using ff::verbs::vfs::Ours;
using ff::verbs::vfs::Stream;

extern "C" {

FFV_EXPORT DIR* opendir(const char* path_arg) {
  static std::atomic<DIR* (*)(const char*)> real{nullptr};
  const ff::verbs::vfs::PathArg p(AT_FDCWD, path_arg);
  const char* const path = p.path();
  const int saved = errno;
  DIR* d = ff::preload::CallNext(real, "opendir", path);
  if (d != nullptr) return d;
  const int err = errno;
  errno = saved;
  bool ours = false;
  DIR* v = ff::verbs::vfs::OpenStream(err, path, &ours);
  if (!ours) errno = err;
  return v;
}

FFV_EXPORT DIR* fdopendir(int fd) {
  static std::atomic<DIR* (*)(int)> real{nullptr};
  ff::verbs::vfs::Hit dir;
  if (!ff::verbs::vfs::DirOfFd(fd, &dir)) return ff::preload::CallNext(real, "fdopendir", fd);
  DIR* d = nullptr;
  if (ff::verbs::Guarded([&] {
        d = ff::verbs::vfs::NewStream(dir, fd);
        return 0;
      }) != 0)
    errno = ENOMEM;
  return d;
}

FFV_EXPORT dirent* readdir(DIR* d) {
  if (Stream* s = Ours(d)) return reinterpret_cast<dirent*>(ff::verbs::vfs::Next(s));
  static std::atomic<dirent* (*)(DIR*)> real{nullptr};
  return ff::preload::CallNext(real, "readdir", d);
}

FFV_EXPORT dirent64* readdir64(DIR* d) {
  if (Stream* s = Ours(d)) return ff::verbs::vfs::Next(s);
  static std::atomic<dirent64* (*)(DIR*)> real{nullptr};
  return ff::preload::CallNext(real, "readdir64", d);
}

FFV_EXPORT int readdir_r(DIR* d, dirent* entry, dirent** result) {
  if (Stream* s = Ours(d)) return ff::verbs::vfs::NextInto(s, entry, result);
  static std::atomic<int (*)(DIR*, dirent*, dirent**)> real{nullptr};
  return ff::preload::CallNext(real, "readdir_r", d, entry, result);
}

FFV_EXPORT int readdir64_r(DIR* d, dirent64* entry, dirent64** result) {
  if (Stream* s = Ours(d)) return ff::verbs::vfs::NextInto(s, entry, result);
  static std::atomic<int (*)(DIR*, dirent64*, dirent64**)> real{nullptr};
  return ff::preload::CallNext(real, "readdir64_r", d, entry, result);
}

FFV_EXPORT int closedir(DIR* d) {
  if (Stream* s = Ours(d)) {
    ff::verbs::vfs::DeleteStream(s);
    return 0;
  }
  static std::atomic<int (*)(DIR*)> real{nullptr};
  return ff::preload::CallNext(real, "closedir", d);
}

FFV_EXPORT int dirfd(DIR* d) noexcept {
  if (Stream* s = Ours(d)) {
    if (s->fd < 0) s->fd = ff::verbs::vfs::OpenDirFd(s->dir, true);
    return s->fd;
  }
  static std::atomic<int (*)(DIR*)> real{nullptr};
  return ff::preload::CallNext(real, "dirfd", d);
}

FFV_EXPORT void rewinddir(DIR* d) {
  if (Stream* s = Ours(d)) {
    s->pos = 0;
    return;
  }
  static std::atomic<void (*)(DIR*)> real{nullptr};
  if (auto* fn = ff::preload::ResolveNext(real, "rewinddir")) fn(d);
}

FFV_EXPORT long telldir(DIR* d) {
  if (Stream* s = Ours(d)) return static_cast<long>(s->pos);
  static std::atomic<long (*)(DIR*)> real{nullptr};
  return ff::preload::CallNext(real, "telldir", d);
}

FFV_EXPORT void seekdir(DIR* d, long pos) {
  if (Stream* s = Ours(d)) {
    s->pos = pos < 0 ? 0 : static_cast<size_t>(pos);
    return;
  }
  static std::atomic<void (*)(DIR*, long)> real{nullptr};
  if (auto* fn = ff::preload::ResolveNext(real, "seekdir")) fn(d, pos);
}

FFV_EXPORT int scandir(const char* path, dirent*** list, int (*filter)(const dirent*),
                       int (*compar)(const dirent**, const dirent**)) {
  static std::atomic<int (*)(const char*, dirent***, int (*)(const dirent*),
                             int (*)(const dirent**, const dirent**))>
      real{nullptr};
  return ff::verbs::vfs::ScanDir(real, "scandir", path, list, filter, compar);
}

FFV_EXPORT int scandir64(const char* path, dirent64*** list, int (*filter)(const dirent64*),
                         int (*compar)(const dirent64**, const dirent64**)) {
  static std::atomic<int (*)(const char*, dirent64***, int (*)(const dirent64*),
                             int (*)(const dirent64**, const dirent64**))>
      real{nullptr};
  return ff::verbs::vfs::ScanDir(real, "scandir64", path, list, filter, compar);
}

}  // extern "C"
