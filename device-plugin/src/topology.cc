#include "topology.h"

#include <algorithm>
#include <map>
#include <set>

namespace ff::dp {
namespace {

constexpr int kNoNuma = -1;

struct Candidate {
  std::string id;
  int numa = kNoNuma;
  std::string group;
};

// Among groups with at least `need` members pick the smallest (keeps large
// groups whole for large later requests); if none fits, the largest.
template <typename Key>
Key best_fit(const std::map<Key, int>& counts, int need, Key fallback) {
  bool found = false;
  Key best = fallback;
  int best_count = 0;
  for (const auto& [key, count] : counts) {
    bool fits = count >= need;
    bool best_fits = found && best_count >= need;
    bool better = !found || (fits && !best_fits) || (fits && best_fits && count < best_count) ||
                  (!fits && !best_fits && count > best_count);
    if (better) {
      best = key;
      best_count = count;
      found = true;
    }
  }
  return best;
}

}  // namespace

std::vector<std::string> preferred_allocation(const std::vector<PluginDevice>& known,
                                              const std::vector<std::string>& available,
                                              const std::vector<std::string>& must_include,
                                              int size) {
  std::map<std::string, const PluginDevice*> by_id;
  for (const auto& d : known) by_id[d.id] = &d;
  auto describe = [&](const std::string& id) {
    Candidate c{id, kNoNuma, ""};
    if (auto it = by_id.find(id); it != by_id.end()) {
      if (it->second->numa_nodes.size() == 1) c.numa = it->second->numa_nodes.front();
      c.group = it->second->pci_group;
    }
    return c;
  };

  std::vector<std::string> result;
  std::set<std::string> taken;
  for (const auto& id : must_include) {
    if (taken.insert(id).second) result.push_back(id);
  }
  int need = size - static_cast<int>(result.size());
  if (need <= 0) return result;

  std::vector<Candidate> pool;
  for (const auto& id : available) {
    if (!taken.count(id)) {
      taken.insert(id);
      pool.push_back(describe(id));
    }
  }

  // Anchor NUMA node: where must_include already lives, else the best fit.
  std::map<int, int> numa_counts;
  for (const auto& id : must_include) numa_counts[describe(id).numa] += 1000000;
  int anchor_numa = kNoNuma;
  if (numa_counts.empty()) {
    for (const auto& c : pool) numa_counts[c.numa]++;
    numa_counts.erase(kNoNuma);
    anchor_numa = best_fit(numa_counts, need, kNoNuma);
  } else {
    anchor_numa = std::max_element(numa_counts.begin(), numa_counts.end(), [](auto& a, auto& b) {
                    return a.second < b.second;
                  })->first;
  }

  // Anchor switch inside that node, chosen the same way.
  std::map<std::string, int> group_counts;
  for (const auto& id : must_include) {
    auto c = describe(id);
    if (!c.group.empty()) group_counts[c.group] += 1000000;
  }
  std::string anchor_group;
  if (group_counts.empty()) {
    for (const auto& c : pool)
      if (c.numa == anchor_numa && !c.group.empty()) group_counts[c.group]++;
    anchor_group = best_fit(group_counts, need, std::string());
  } else {
    anchor_group = std::max_element(group_counts.begin(), group_counts.end(), [](auto& a, auto& b) {
                     return a.second < b.second;
                   })->first;
  }

  auto rank = [&](const Candidate& c) {
    int r = 0;
    if (c.numa != anchor_numa || anchor_numa == kNoNuma) r += 2;
    if (anchor_group.empty() || c.group != anchor_group) r += 1;
    return r;
  };
  std::stable_sort(pool.begin(), pool.end(), [&](const Candidate& a, const Candidate& b) {
    int ra = rank(a), rb = rank(b);
    if (ra != rb) return ra < rb;
    return a.id < b.id;
  });
  for (int i = 0; i < need && i < static_cast<int>(pool.size()); ++i) result.push_back(pool[i].id);
  return result;
}

}  // namespace ff::dp
