#include "tcpmode/pod_list.h"

#include <fcntl.h>

#include <cerrno>
#include <string>
#include <vector>

#include "freeflow/stream_pods.h"

namespace ff::router {

int TcpModePodList::Create() {
  if (const int rc = CreateSegment("ffrouter-streampods", kStreamPodsBytes, &fd_)) return rc;
  if (const int rc = MapSegment(fd_.get(), kStreamPodsBytes, true, &map_)) return rc;
  map_.as<StreamPodsHeader>()->magic = kStreamPodsMagic;
  // As the MR tables: no pod can map it writable, even through a reopened /proc/self/fd.
  if (const int rc = SealReadOnly(fd_.get())) return rc;
  const std::string self = "/proc/self/fd/" + std::to_string(fd_.get());
  ro_fd_.reset(::open(self.c_str(), O_RDONLY | O_CLOEXEC));
  if (!ro_fd_) return errno;
  Publish();
  return 0;
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
