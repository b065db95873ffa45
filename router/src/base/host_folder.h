// The node's shared folder (/freeflow by default), mounted read-only into pods: the router's
// socket lives there and the container library is installed there. One router serves one
// socket name in it.
//
// Pods must not be able to change what later pods load or reach, and the root router must
// not be steered by what it finds there (docs/security.md, "The shared folder"): the folder
// must belong to the router's user and be writable by no one else; everything in it is
// reached through one directory descriptor opened without following links; files are
// created under a temporary name with O_EXCL|O_NOFOLLOW and renamed into place; an existing
// socket name is replaced only when it is a socket no one serves. The one-router lock is not
// a file in the folder (a pod can flock() a file it can only read).
#pragma once

#include <sys/types.h>

#include <string>

#include "freeflow/fd.h"
#include "freeflow/router_socket.h"

namespace ff::router {

class HostFolder {
 public:
  HostFolder() = default;
  HostFolder(const HostFolder&) = delete;
  HostFolder& operator=(const HostFolder&) = delete;
  // Removes the socket this router bound, if it is still the one in the folder.
  ~HostFolder();

  // Checks `dir`, makes sure no other router serves <dir>/<name>.sock and installs `library_source`
  // (empty: skip) as <dir>/libffverbs.so. false + *error (a sentence a person can act on) when any
  // step fails.
  bool Take(const std::string& dir, const std::string& name, const std::string& library_source,
            std::string* error);
  // After Take failed: whether it was because another router of this network namespace
  // holds the lock (it may hand over: docs/handover.md).
  bool held_by_another() const { return held_by_another_; }
  // Takes a predecessor's lock and pod socket (its inode) as its own; then installs
  // `library_source` as Take does. false + *error.
  bool Adopt(UniqueFd lock, ino_t socket_ino, const std::string& library_source,
             std::string* error);
  int lock_fd() const { return lock_.get(); }
  ino_t socket_ino() const { return socket_ino_; }
  // Installs `source` as <dir>/libfsocket.so (TCP mode's library) as Take() installs the
  // container library. Call after Take(). false + *error.
  bool InstallSocketLibrary(const std::string& source, std::string* error);
  // Creates the pods' socket (SOCK_SEQPACKET, non-blocking) bound at socket_path(), mode
  // 0666: bound under a temporary name, then renamed over a stale socket of a dead router.
  // Call after Take(). false + *error.
  bool BindSocket(UniqueFd* out, std::string* error);
  std::string socket_path() const { return RouterSocketPath(dir_, name_); }
  // The heartbeat: <dir>/<name>.alive, made by Take() and touched by Beat() while the
  // router's loop turns. Its age is what the DaemonSet's liveness probe checks: a router
  // that hangs stops touching it (the socket alone stays there). 0 or an errno.
  int Beat();
  std::string alive_path() const { return dir_ + "/" + name_ + ".alive"; }

 private:
  bool OpenFolder(const std::string& dir, std::string* error);
  bool TakeLock(std::string* error);
  bool SocketAnswers() const;
  // Copies `source` to <dir>/<name> through a temporary name and an atomic rename.
  bool InstallLibrary(const std::string& source, const char* name, std::string* error);
  // "/proc/self/fd/<folder>/<entry>": a path that reaches `entry` through the folder's
  // descriptor, for calls that take no directory descriptor (bind).
  std::string ThroughFolder(const std::string& entry) const;

  std::string dir_;
  std::string name_;
  UniqueFd folder_;       // O_DIRECTORY|O_NOFOLLOW descriptor of dir_
  UniqueFd lock_;         // an abstract socket bound in the router's network namespace
  ino_t socket_ino_ = 0;  // the socket file this router put in place
  bool held_by_another_ = false;
  UniqueFd alive_;        // the heartbeat file (Beat)
};

}  // namespace ff::router
