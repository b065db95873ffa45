#include "tcpmode/claims_table.h"

#include <fcntl.h>

#include <cerrno>
#include <string>

namespace ff::router {

int TcpModeClaims::Create() {
  if (const int rc = CreateSegment("ffrouter-streamclaims", kStreamClaimsBytes, &fd_)) return rc;
  if (const int rc = MapSegment(fd_.get(), kStreamClaimsBytes, true, &map_)) return rc;
  map_.as<StreamClaimsHeader>()->magic = kStreamClaimsMagic;
  // As the pod list: no pod can map it writable, even through a reopened /proc/self/fd.
  if (const int rc = SealReadOnly(fd_.get())) return rc;
  const std::string self = "/proc/self/fd/" + std::to_string(fd_.get());
  ro_fd_.reset(::open(self.c_str(), O_RDONLY | O_CLOEXEC));
  if (!ro_fd_) return errno;
  writer_.emplace(map_.get());
  return 0;
}

bool TcpModeClaims::Add(uint64_t key) { return writer_ && writer_->Add(key); }

void TcpModeClaims::Remove(uint64_t key, bool placed) {
  if (writer_) writer_->Remove(key, placed);
}

}  // namespace ff::router
