// TCP mode's claims table of one pod (core/include/freeflow/stream_claims.h) on the router's
// side: the memfd only the router writes, its read-only twin for the pod's socket sessions,
// and the unclaimed records in which that pod is the server.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "freeflow/fd.h"
#include "freeflow/stream_claims.h"

namespace ff::router {

class TcpModeClaims {
 public:
  TcpModeClaims() = default;
  ~TcpModeClaims();
  TcpModeClaims(const TcpModeClaims&) = delete;
  TcpModeClaims& operator=(const TcpModeClaims&) = delete;
  // Creates the memfd and its read-only twin. 0 or an errno value; without it, the pod's
  // libraries ask the router about every connection they accept.
  int Create();
  // What the pod's socket sessions get at kSockHello, or -1 when Create failed.
  int read_only_fd() const { return ro_fd_ ? ro_fd_.get() : -1; }
  // A record the pod is the server of, not claimed yet: in the slots (true) or spilled
  // (false: the pod's libraries ask about every connection until it goes).
  bool Add(uint64_t key);
  // Takes out what Add did for `key` (`placed`: what Add returned).
  void Remove(uint64_t key, bool placed);
  // The hand-over: the router's descriptor (-1 without a table); and a table another router
  // made, from its two descriptors, written on from here. "" or why they are not such a
  // table.
  int rw_fd() const { return fd_ ? fd_.get() : -1; }
  std::string Adopt(UniqueFd rw, UniqueFd ro);

 private:
  UniqueFd fd_;
  UniqueFd ro_fd_;
  Mapping map_;
  std::optional<StreamClaimsWriter> writer_;
};

}  // namespace ff::router
