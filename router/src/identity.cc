#include "identity.h"

#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "freeflow/fd.h"

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif

namespace ff::router {
namespace {

// Lists the IPv4 addresses of the network namespace behind `nsfd` (a pidfd or an
// /proc/<pid>/ns/net descriptor). setns() only moves the calling thread, so a
// short-lived thread does the work and the router's own namespace is never touched.
bool AddressInNamespace(int nsfd, const Ipv4Prefix& overlay, uint32_t* out, std::string* error) {
  bool found = false;
  std::string err;
  std::thread worker([&] {
    if (::setns(nsfd, CLONE_NEWNET) != 0) {
      err = std::string("cannot enter the client's network namespace: ") + std::strerror(errno);
      return;
    }
    struct ifaddrs* list = nullptr;
    if (::getifaddrs(&list) != 0) {
      err = std::string("cannot list the client's addresses: ") + std::strerror(errno);
      return;
    }
    for (struct ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
      if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
      const uint32_t a = ntohl(reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr);
      if (overlay.Contains(a)) {
        *out = a;
        found = true;
        break;
      }
    }
    ::freeifaddrs(list);
    if (!found) {
      err = "no IPv4 address inside the overlay prefix " + overlay.ToString() +
            " in its network namespace";
    }
  });
  worker.join();
  if (!found) *error = err;
  return found;
}

class NetnsIdentityResolver : public IdentityResolver {
 public:
  explicit NetnsIdentityResolver(Ipv4Prefix overlay) : overlay_(overlay) {}

  bool Resolve(int sock, PodIdentity* out, std::string* error) override {
    struct ucred cred {};
    socklen_t len = sizeof(cred);
    if (::getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
      *error = std::string("cannot read peer credentials: ") + std::strerror(errno);
      return false;
    }
    // A pidfd names the process that connected even if its pid is reused later.
    int pidfd = -1;
    len = sizeof(pidfd);
    UniqueFd nsfd;
    if (::getsockopt(sock, SOL_SOCKET, SO_PEERPIDFD, &pidfd, &len) == 0 && pidfd >= 0) {
      nsfd.reset(pidfd);
    } else {
      const std::string path = "/proc/" + std::to_string(cred.pid) + "/ns/net";
      nsfd.reset(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
      if (!nsfd) {
        *error = "cannot open " + path + ": " + std::strerror(errno);
        return false;
      }
    }
    out->pid = cred.pid;
    return AddressInNamespace(nsfd.get(), overlay_, &out->ip, error);
  }

 private:
  Ipv4Prefix overlay_;
};

}  // namespace

std::unique_ptr<IdentityResolver> MakeNetnsIdentityResolver(Ipv4Prefix overlay) {
  return std::make_unique<NetnsIdentityResolver>(overlay);
}

}  // namespace ff::router
