// Finding 7: the shared folder was writable by pods, so a root pod could replace
// libffverbs.so for every later pod, remove the router's socket and bind a fake router that
// receives every new pod's memory, or plant links for the root router to follow. The script
// runs the attacker as a pod sees the folder: the read-only bind mount the device plugin asks
// for, in a mount namespace of its own, as root without CAP_SYS_ADMIN (a container's root).
// It tries every way to change what is there, to remount it writable and to uncover what is
// under the mount; each must fail. The library's bytes must not change, and the router's
// socket must still serve it.
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>

#include "adversary.h"

namespace ff::adversary {
namespace {

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs one attempt: `attempt` returns 0 when it worked, else an errno.
void Try(Report& r, const std::string& tried, const std::function<int()>& attempt) {
  const int err = attempt();
  r.Check(err != 0, tried, err == 0 ? "it worked" : ErrName(err));
}

int Errno(int rc) { return rc == 0 ? 0 : errno; }

int OpenFor(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC, 0755);
  if (fd < 0) return errno;
  ::close(fd);
  return 0;
}

int BindAt(const std::string& path) {
  UniqueFd s(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) return ENAMETOOLONG;
  std::memcpy(addr.sun_path, path.c_str(), path.size());
  return Errno(::bind(s.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)));
}

}  // namespace

int Folder(const Args& a) {
  Report r("7", "folder");
  const Rendezvous rv(a.meet);
  const char* env = std::getenv("FREEFLOW_DIR");
  const std::string dir = env != nullptr ? env : "/freeflow";
  const char* name_env = std::getenv("FFR_NAME");
  const std::string sock = dir + "/" + (name_env != nullptr ? name_env : "ffrouter") + ".sock";
  const std::string lib = dir + "/libffverbs.so";
  const std::string before = Slurp(lib);
  if (before.empty()) {
    r.Check(false, "setting up", "no library at " + lib);
    return Conclude(r, rv);
  }

  Try(r, "open libffverbs.so for writing", [&] { return OpenFor(lib, O_WRONLY); });
  Try(r, "truncate libffverbs.so", [&] { return Errno(::truncate(lib.c_str(), 0)); });
  Try(r, "create a replacement library next to it",
      [&] { return OpenFor(dir + "/.libffverbs.so.tmp.1", O_WRONLY | O_CREAT | O_EXCL); });
  Try(r, "rename libffverbs.so away",
      [&] { return Errno(::rename(lib.c_str(), (dir + "/old.so").c_str())); });
  Try(r, "chmod libffverbs.so", [&] { return Errno(::chmod(lib.c_str(), 0777)); });
  Try(r, "remove the router's socket", [&] { return Errno(::unlink(sock.c_str())); });
  Try(r, "bind a fake router at a new name", [&] { return BindAt(dir + "/fake.sock"); });
  Try(r, "plant a link at the library's temporary name",
      [&] { return Errno(::symlink("/etc/passwd", (dir + "/.libffverbs.so.tmp.1").c_str())); });
  Try(r, "create a lock file for the router's name",
      [&] { return OpenFor(dir + "/ffrouter.lock", O_RDWR | O_CREAT); });
  Try(r, "remount the folder writable",
      [&] { return Errno(::mount(nullptr, dir.c_str(), nullptr, MS_REMOUNT | MS_BIND, nullptr)); });
  Try(r, "unmount the read-only view to reach the folder under it",
      [&] { return Errno(::umount2(dir.c_str(), MNT_DETACH)); });

  r.Check(Slurp(lib) == before, "libffverbs.so after the attempts",
          Slurp(lib) == before ? "the same bytes" : "CHANGED");
  RawPod pod = OpenPod();
  const int hello = pod.Hello(Abi());
  r.Check(hello == 0, "the router's socket after the attempts", "HELLO " + ErrName(hello));
  return Conclude(r, rv);
}

}  // namespace ff::adversary
