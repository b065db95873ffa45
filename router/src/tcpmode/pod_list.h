// TCP mode's pod list (core/include/freeflow/stream_pods.h) on the router's side: the memfd
// only the router writes, its read-only twin for socket sessions, and why each address is
// listed (a socket session of the pod, an end of a record), so that an address stays listed
// while anything may still need a round trip for it.
#pragma once

#include <cstdint>
#include <map>

#include "freeflow/fd.h"

namespace ff::router {

class TcpModePodList {
 public:
  // Creates the memfd and its read-only twin. 0 or an errno value; without it, libraries
  // ask the router about every connection.
  int Create();
  // What socket sessions get at kSockHello, or -1 when Create failed.
  int read_only_fd() const { return ro_fd_ ? ro_fd_.get() : -1; }
  // One more, or one fewer, reason to list host-order address `ip`. The list is rewritten
  // when an address comes or goes.
  void Hold(uint32_t ip);
  void Let(uint32_t ip);
  bool Listed(uint32_t ip) const { return refs_.contains(ip); }

 private:
  void Publish();

  UniqueFd fd_;
  UniqueFd ro_fd_;
  Mapping map_;
  std::map<uint32_t, uint32_t> refs_;  // address -> reasons (sorted, as the list)
};

}  // namespace ff::router
