// Lookup in the router's tables of owned objects.
#pragma once

namespace ff::router {

// The object `key` names in a map of owning pointers, or nullptr.
template <typename Map, typename Key>
auto* FindIn(Map& objects, const Key& key) {
  auto it = objects.find(key);
  return it == objects.end() ? nullptr : it->second.get();
}

}  // namespace ff::router
