// The process on the other end of a connected Unix socket, pinned by a pidfd so that a pid
// reused later cannot stand in for it.
//
// With SO_PEERPIDFD (Linux >= 6.5) the kernel hands over a pidfd of the process that
// connected. Without it, the pid from SO_PEERCRED may have been recycled between connect()
// and now; the pid is then opened as a pidfd and accepted only if that process holds the
// other end of this very connection (its socket inode, from sock_diag, in /proc/<pid>/fd),
// checked again to be alive after its namespace was opened.
#pragma once

#include <sys/types.h>

#include <string>

#include "freeflow/fd.h"

namespace ff::router {

struct PeerProcess {
  pid_t pid = 0;
  UniqueFd pidfd;
  UniqueFd netns;  // the fallback's /proc/<pid>/ns/net; empty: setns() takes the pidfd
  int namespace_handle() const { return netns ? netns.get() : pidfd.get(); }
};

// Finds the peer of `sock`. `use_peer_pidfd` false skips SO_PEERPIDFD (tests of the
// fallback). false + *error (a sentence a person can act on).
bool FindPeerProcess(int sock, bool use_peer_pidfd, PeerProcess* out, std::string* error);

// The inode of the socket at the other end of connected Unix socket `sock`, from the
// kernel's sock_diag (0 + *error when it cannot be read).
ino_t PeerSocketInode(int sock, std::string* error);

}  // namespace ff::router
