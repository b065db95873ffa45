#include "identity/router_peer.h"

#include <linux/capability.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "freeflow/fd.h"
#include "identity/peer_process.h"

namespace ff::router {
namespace {

bool Alive(int pidfd) { return ::syscall(SYS_pidfd_send_signal, pidfd, 0, nullptr, 0) == 0; }

// The inode of network namespace file `path` (0 when it cannot be read).
ino_t NamespaceInode(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? st.st_ino : 0;
}

// The CapEff field of /proc/<pid>/status ("" when it cannot be read).
std::string EffectiveCaps(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("CapEff:", 0) == 0) {
      std::istringstream fields(line.substr(7));
      std::string hex;
      fields >> hex;
      return hex;
    }
  }
  return "";
}

}  // namespace

bool HoldsSysAdmin(const std::string& cap_eff) {
  if (cap_eff.empty() || cap_eff.size() > 16 ||
      cap_eff.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
    return false;
  const unsigned long long bits = std::stoull(cap_eff, nullptr, 16);
  return ((bits >> CAP_SYS_ADMIN) & 1) != 0;
}

bool TrustedRouterPeer(int sock, std::string* why) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (::getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    *why = std::string("cannot ask the kernel who connected: ") + std::strerror(errno);
    return false;
  }
  if (cred.uid != ::geteuid()) {
    *why = "uid " + std::to_string(cred.uid) + " is not the router's user";
    return false;
  }
  PeerProcess peer;
  if (!FindPeerProcess(sock, true, &peer, why)) return false;
  const std::string proc = "/proc/" + std::to_string(peer.pid);
  const ino_t theirs = NamespaceInode(proc + "/ns/net");
  const std::string caps = EffectiveCaps(peer.pid);
  if (!Alive(peer.pidfd.get())) {
    *why = "pid " + std::to_string(peer.pid) + " exited while it was checked";
    return false;
  }
  if (theirs == 0 || theirs != NamespaceInode("/proc/self/ns/net")) {
    *why = "pid " + std::to_string(peer.pid) + " is not in the router's network namespace";
    return false;
  }
  if (!HoldsSysAdmin(caps)) {
    *why = "pid " + std::to_string(peer.pid) + " lacks CAP_SYS_ADMIN";
    return false;
  }
  return true;
}

}  // namespace ff::router
