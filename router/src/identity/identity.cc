#include "identity/identity.h"

#include <fcntl.h>
#include <net/if.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "freeflow/fd.h"
#include "identity/netns_probe.h"
#include "identity/peer_process.h"

namespace ff::router {
namespace {

struct NetnsId {
  dev_t dev = 0;
  ino_t ino = 0;
  bool operator==(const NetnsId&) const = default;
};

// What the worker thread saw inside the client's network namespace.
struct NamespaceView {
  NetnsId id;
  std::vector<InterfaceAddress> addresses;
};

// Reads the namespace behind `nsfd` (a pidfd or an /proc/<pid>/ns/net descriptor) from a
// thread inside it: the router's own namespace is never touched.
bool ReadClientNamespace(int nsfd, int router_netns, NamespaceView* view, std::string* error) {
  return RunInNamespace(
      nsfd,
      [&](dev_t dev, ino_t ino, std::string* err) {
        view->id = {dev, ino};
        ReadNamespaceAddresses(router_netns, &view->addresses, err);
      },
      error);
}

class NetnsIdentityResolver : public IdentityResolver {
 public:
  NetnsIdentityResolver(IdentityOptions options, UniqueFd own, NetnsId own_id)
      : options_(options), own_(std::move(own)), own_id_(own_id) {}

  bool Resolve(int sock, PodIdentity* out, std::string* error) override {
    if (!own_) {
      *error = "the router cannot open its own network namespace (/proc/self/ns/net)";
      return false;
    }
    PeerProcess peer;
    if (!FindPeerProcess(sock, options_.use_peer_pidfd, &peer, error)) return false;
    out->pid = peer.pid;
    NamespaceView view;
    if (!ReadClientNamespace(peer.namespace_handle(), own_.get(), &view, error)) return false;
    out->netns = view.id.ino;
    const bool router_namespace = view.id == own_id_;
    if (router_namespace && !options_.allow_host_network) {
      *error =
          "it runs in the router's own network namespace (host network); "
          "--allow-host-network-clients serves such processes";
      return false;
    }
    return ChooseOverlayAddress(view.addresses, options_.overlay, router_namespace, &out->ip,
                                error);
  }

 private:
  const IdentityOptions options_;
  const UniqueFd own_;  // the router's network namespace, for the kernel to compare links to
  const NetnsId own_id_;
};

std::string Where(const InterfaceAddress& a) { return FormatIpv4(a.ip) + " on " + a.ifname; }

}  // namespace

bool ChooseOverlayAddress(const std::vector<InterfaceAddress>& addresses, const Ipv4Prefix& overlay,
                          bool router_namespace, uint32_t* ip, std::string* error) {
  std::vector<const InterfaceAddress*> inside;
  for (const InterfaceAddress& a : addresses)
    if (overlay.Contains(a.ip)) inside.push_back(&a);
  if (inside.empty()) {
    *error = "no IPv4 address inside the overlay prefix " + overlay.ToString() +
             " in its network namespace";
    return false;
  }
  if (inside.size() > 1) {
    // An added address (a victim's, on lo or anywhere) makes the namespace ambiguous.
    *error = std::to_string(inside.size()) + " addresses inside the overlay prefix (" +
             Where(*inside[0]) + ", " + Where(*inside[1]) + (inside.size() > 2 ? ", ..." : "") +
             "); a pod has one";
    return false;
  }
  const InterfaceAddress* one = inside[0];
  if ((one->flags & IFF_LOOPBACK) != 0) {
    *error = "its overlay address " + Where(*one) + " is on a loopback interface";
    return false;
  }
  if ((one->flags & IFF_UP) == 0) {
    *error = "its overlay address " + Where(*one) + " is on an interface that is down";
    return false;
  }
  if (!router_namespace && !one->linked) {
    *error = "its overlay address " + Where(*one) +
             " is on an interface not linked to the router's network namespace";
    return false;
  }
  *ip = one->ip;
  return true;
}

std::unique_ptr<IdentityResolver> MakeNetnsIdentityResolver(IdentityOptions options) {
  UniqueFd own(::open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC));
  struct stat st {};
  if (own && ::fstat(own.get(), &st) != 0) own.reset();
  return std::make_unique<NetnsIdentityResolver>(options, std::move(own),
                                                 NetnsId{st.st_dev, st.st_ino});
}

}  // namespace ff::router
