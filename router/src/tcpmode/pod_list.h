// TCP mode's pod list (core/include/freeflow/stream_pods.h) on the router's side: the memfd
// only the router writes, its read-only twin for socket sessions, and why each address is
// listed (a socket session of the pod, an end of a record), so that an address stays listed
// while anything may still need a round trip for it.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "freeflow/fd.h"

namespace ff::router {

// A table the router alone writes and pods map read-only (the pod list, a pod's claims
// table): a zeroed table of `bytes` (base/table_store.h) mapped writable here with `magic` at
// offset 4, and a read-only descriptor of it to hand out that no holder can write through
// (a read-only mount, or a memfd sealed against writable mappings). 0 or an errno.
int MakeSharedTable(const char* name, uint64_t bytes, uint32_t magic, UniqueFd* fd, Mapping* map,
                    UniqueFd* read_only);

// Takes a table another router made with MakeSharedTable (a hand-over): checks that `rw` and
// `ro` are router tables of at least `bytes` with `magic`, and maps `rw` writable. "" or
// why they are not.
std::string AdoptSharedTable(UniqueFd rw, UniqueFd ro, uint64_t bytes, uint32_t magic, UniqueFd* fd,
                             Mapping* map, UniqueFd* read_only);

// Marks a table MakeSharedTable made as being rewritten for good (its sequence word odd):
// a library that still maps it after this router stopped asks the router it finds instead.
void RetireSharedTable(Mapping& map);

class TcpModePodList {
 public:
  TcpModePodList() = default;
  ~TcpModePodList() { RetireSharedTable(map_); }
  TcpModePodList(const TcpModePodList&) = delete;
  TcpModePodList& operator=(const TcpModePodList&) = delete;
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
  // The hand-over: the router's descriptor and the read-only one (-1 without a list); and
  // the list another router wrote, in place of this one's (which no pod has), holding
  // `refs` and published. "" or why the descriptors are not such a list.
  int rw_fd() const { return fd_ ? fd_.get() : -1; }
  int ro_fd() const { return read_only_fd(); }
  std::string Adopt(UniqueFd rw, UniqueFd ro, std::map<uint32_t, uint32_t> refs);

 private:
  void Publish();

  UniqueFd fd_;
  UniqueFd ro_fd_;
  Mapping map_;
  std::map<uint32_t, uint32_t> refs_;  // address -> reasons (sorted, as the list)
};

}  // namespace ff::router
