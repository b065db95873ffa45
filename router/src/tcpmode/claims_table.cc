#include "tcpmode/claims_table.h"

#include <cerrno>
#include <cstddef>

#include "tcpmode/pod_list.h"

namespace ff::router {

int TcpModeClaims::Create() {
  static_assert(offsetof(StreamClaimsHeader, magic) == 4);
  if (const int rc = MakeSharedTable("ffrouter-streamclaims", kStreamClaimsBytes,
                                     kStreamClaimsMagic, &fd_, &map_, &ro_fd_))
    return rc;
  writer_.emplace(map_.get());
  return 0;
}

std::string TcpModeClaims::Adopt(UniqueFd rw, UniqueFd ro) {
  if (std::string why = AdoptSharedTable(std::move(rw), std::move(ro), kStreamClaimsBytes,
                                         kStreamClaimsMagic, &fd_, &map_, &ro_fd_);
      !why.empty())
    return why;
  writer_.emplace(map_.get());
  return "";
}

TcpModeClaims::~TcpModeClaims() { RetireSharedTable(map_); }

bool TcpModeClaims::Add(uint64_t key) { return writer_ && writer_->Add(key); }

void TcpModeClaims::Remove(uint64_t key, bool placed) {
  if (writer_) writer_->Remove(key, placed);
}

}  // namespace ff::router
