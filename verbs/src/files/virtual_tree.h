// A read-only tree of directories, files and symbolic links that the process sees at absolute
// paths where the real file system has nothing: the device's sysfs view (views/sysfs_view.h)
// is one. This is the data and the path walk only; virtual_files.h serves it through libc.
//
// Paths resolve as the kernel resolves them: component by component, ".." of a directory is
// its parent (after a symbolic link was followed, the parent of where it led), "." and empty
// components are nothing, and a link's target is read relative to the directory holding it.
// The tree holds its directories' ancestors up to "/", which lists only what the tree adds.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace ff::verbs::vfs {

enum class Kind : uint8_t { kDir, kFile, kLink };

struct Node {
  Kind kind = Kind::kDir;
  std::string data;                      // a file's content, a link's target
  std::map<std::string, Kind> children;  // a directory's entries, in name order
  uint64_t ino = 0;                      // stable for a path: a hash of it
};

// Where a walk ended: the node and the path it has in the tree (no links, "." or "..").
struct Found {
  const Node* node;
  std::string path;
};

class Tree {
 public:
  Tree();

  // Adds a file or a link at an absolute canonical path, and every missing directory above
  // it. Replacing an entry of another kind, or adding below a file or link, throws
  // std::invalid_argument (a bug of the tree's builder).
  void AddFile(std::string_view path, std::string content);
  void AddLink(std::string_view path, std::string target);
  void AddDir(std::string_view path);

  // Walks an absolute path; the last component's link is followed when `follow`. Fails with
  // ENOENT (nothing there), ENOTDIR (a file where a directory must be), ELOOP (more than 40
  // links) or EINVAL (a relative path).
  std::optional<Found> Resolve(std::string_view path, bool follow, int* err) const;

  const Node* At(std::string_view canonical) const;
  size_t size() const { return nodes_.size(); }

 private:
  Node& Make(std::string_view path, Kind kind);
  std::map<std::string, Node, std::less<>> nodes_;
};

// "a/b/../c" joined to a base directory's canonical path, for paths given relative to a
// directory of the tree.
std::string JoinPath(std::string_view dir, std::string_view rel);

}  // namespace ff::verbs::vfs
