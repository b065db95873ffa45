#include "files/virtual_tree.h"

#include <cerrno>
#include <stdexcept>
#include <vector>

namespace ff::verbs::vfs {
namespace {

constexpr int kMaxLinks = 40;  // the kernel's MAXSYMLINKS

// FNV-1a: a stable inode number for a path, never 0.
uint64_t InodeOf(std::string_view path) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (const char c : path) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ULL;
  }
  return h == 0 ? 1 : h;
}

// The components of `path` (empty ones included: a trailing '/' leaves one).
std::vector<std::string> Split(std::string_view path) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= path.size()) {
    const size_t slash = path.find('/', start);
    const size_t end = slash == std::string_view::npos ? path.size() : slash;
    parts.emplace_back(path.substr(start, end - start));
    if (slash == std::string_view::npos) break;
    start = slash + 1;
  }
  return parts;
}

std::string Join(const std::vector<std::string>& parts) {
  if (parts.empty()) return "/";
  std::string out;
  for (const std::string& p : parts) out += "/" + p;
  return out;
}

// Pushes `path`'s components so that the first is taken next.
void PushReversed(std::vector<std::string>* pending, std::string_view path) {
  std::vector<std::string> parts = Split(path);
  for (auto it = parts.rbegin(); it != parts.rend(); ++it) pending->push_back(std::move(*it));
}

}  // namespace

Tree::Tree() { nodes_["/"].ino = InodeOf("/"); }

Node& Tree::Make(std::string_view path, Kind kind) {
  if (path.size() < 2 || path[0] != '/' || path.back() == '/')
    throw std::invalid_argument("not a canonical absolute path");
  const size_t slash = path.rfind('/');
  const std::string parent(slash == 0 ? std::string_view("/") : path.substr(0, slash));
  if (parent != "/") AddDir(parent);
  Node& dir = nodes_.at(parent);
  if (dir.kind != Kind::kDir) throw std::invalid_argument("an entry below a file or link");
  const std::string name(path.substr(slash + 1));
  if (name == "." || name == "..") throw std::invalid_argument("a dot entry");
  auto [it, added] = nodes_.try_emplace(std::string(path));
  if (!added && it->second.kind != kind) throw std::invalid_argument("an entry of another kind");
  it->second.kind = kind;
  it->second.ino = InodeOf(path);
  dir.children[name] = kind;
  return it->second;
}

void Tree::AddDir(std::string_view path) {
  if (path == "/") return;
  Make(path, Kind::kDir);
}

void Tree::AddFile(std::string_view path, std::string content) {
  Make(path, Kind::kFile).data = std::move(content);
}

void Tree::AddLink(std::string_view path, std::string target) {
  Make(path, Kind::kLink).data = std::move(target);
}

const Node* Tree::At(std::string_view canonical) const {
  const auto it = nodes_.find(canonical);
  return it == nodes_.end() ? nullptr : &it->second;
}

std::optional<Found> Tree::Resolve(std::string_view path, bool follow, int* err) const {
  if (path.empty() || path[0] != '/') {
    *err = path.empty() ? ENOENT : EINVAL;
    return std::nullopt;
  }
  std::vector<std::string> pending;
  PushReversed(&pending, path.substr(1));
  std::vector<std::string> at;  // the canonical components walked so far
  const Node* node = At("/");
  int links = 0;
  while (!pending.empty()) {
    std::string part = std::move(pending.back());
    pending.pop_back();
    if (part.empty()) continue;
    if (node->kind != Kind::kDir) {
      *err = ENOTDIR;
      return std::nullopt;
    }
    if (part == ".") continue;
    if (part == "..") {
      if (!at.empty()) at.pop_back();
      node = At(Join(at));
      continue;
    }
    at.push_back(std::move(part));
    const Node* next = At(Join(at));
    if (next == nullptr) {
      *err = ENOENT;
      return std::nullopt;
    }
    // A link is followed in the middle of a path (a trailing '/' leaves a component after
    // it), and at its end when asked.
    if (next->kind == Kind::kLink && (follow || !pending.empty())) {
      if (++links > kMaxLinks || next->data.empty()) {
        *err = next->data.empty() ? ENOENT : ELOOP;
        return std::nullopt;
      }
      at.pop_back();
      if (!next->data.empty() && next->data[0] == '/') at.clear();
      node = At(Join(at));
      PushReversed(&pending, next->data[0] == '/' ? next->data.substr(1) : next->data);
      continue;
    }
    node = next;
  }
  return Found{node, Join(at)};
}

std::string JoinPath(std::string_view dir, std::string_view rel) {
  if (!rel.empty() && rel[0] == '/') return std::string(rel);
  std::string out(dir);
  if (out.empty() || out.back() != '/') out += '/';
  out += rel;
  return out;
}

}  // namespace ff::verbs::vfs
