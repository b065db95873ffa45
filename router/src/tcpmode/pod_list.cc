#include "tcpmode/pod_list.h"

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "base/table_store.h"
#include "freeflow/stream_claims.h"
#include "freeflow/stream_pods.h"

namespace ff::router {

int MakeSharedTable(const char* name, uint64_t bytes, uint32_t magic, UniqueFd* fd, Mapping* map,
                    UniqueFd* read_only) {
  // As the MR tables (base/table_store.h): no pod can write it, even through a reopened
  // /proc/self/fd; a router that takes over could, through `fd`.
  if (const int rc = RouterTables().Make(name, bytes, fd, read_only, map)) return rc;
  std::memcpy(static_cast<char*>(map->get()) + 4, &magic, sizeof(magic));
  return 0;
}

std::string AdoptSharedTable(UniqueFd rw, UniqueFd ro, uint64_t bytes, uint32_t magic, UniqueFd* fd,
                             Mapping* map, UniqueFd* read_only) {
  Mapping m;
  uint32_t found = 0;
  if (std::string why = TableStore::Adopt(rw.get(), ro.get(), bytes, &m); !why.empty()) return why;
  std::memcpy(&found, static_cast<const char*>(m.get()) + 4, sizeof(found));
  if (found != magic) return "it is another kind of table (magic " + std::to_string(found) + ")";
  *fd = std::move(rw);
  *read_only = std::move(ro);
  *map = std::move(m);
  return "";
}

void RetireSharedTable(Mapping& map) {
  if (map.get() == nullptr) return;
  static_assert(offsetof(StreamPodsHeader, seq) == 0 && offsetof(StreamClaimsHeader, seq) == 0);
  auto* seq = static_cast<std::atomic<uint32_t>*>(map.get());
  seq->store(seq->load(std::memory_order_relaxed) | 1, std::memory_order_release);
}

int TcpModePodList::Create() {
  static_assert(offsetof(StreamPodsHeader, magic) == 4);
  if (const int rc = MakeSharedTable("ffrouter-streampods", kStreamPodsBytes, kStreamPodsMagic,
                                     &fd_, &map_, &ro_fd_))
    return rc;
  Publish();
  return 0;
}

std::string TcpModePodList::Adopt(UniqueFd rw, UniqueFd ro, std::map<uint32_t, uint32_t> refs) {
  UniqueFd fd, read_only;
  Mapping map;
  if (std::string why = AdoptSharedTable(std::move(rw), std::move(ro), kStreamPodsBytes,
                                         kStreamPodsMagic, &fd, &map, &read_only);
      !why.empty())
    return why;
  fd_ = std::move(fd);
  ro_fd_ = std::move(read_only);
  map_ = std::move(map);
  refs_ = std::move(refs);
  Publish();
  return "";
}

void TcpModePodList::Hold(uint32_t ip) {
  if (++refs_[ip] == 1) Publish();
}

void TcpModePodList::Let(uint32_t ip) {
  auto it = refs_.find(ip);
  if (it == refs_.end()) return;
  if (--it->second > 0) return;
  refs_.erase(it);
  Publish();
}

void TcpModePodList::Publish() {
  if (map_.get() == nullptr) return;
  std::vector<uint32_t> ips;
  ips.reserve(refs_.size());
  for (const auto& [ip, n] : refs_) ips.push_back(ip);
  WriteStreamPods(map_.get(), ips.data(), static_cast<uint32_t>(ips.size()));
}

}  // namespace ff::router
