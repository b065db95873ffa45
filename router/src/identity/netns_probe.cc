#include "identity/netns_probe.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/if_link.h>
#include <linux/net_namespace.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <system_error>
#include <thread>
#include <unordered_map>

#include "freeflow/fd.h"
#include "freeflow/tunables.h"
#include "identity/peer_process.h"

namespace ff::router {
namespace {

using Each = std::function<void(const nlmsghdr*)>;

// Calls f(type, data, bytes) for every attribute in the `len` bytes at `begin`.
template <typename F>
void ForEachAttribute(const void* begin, int len, F f) {
  for (auto* a = static_cast<const rtattr*>(begin); RTA_OK(a, len); a = RTA_NEXT(a, len))
    f(a->rta_type, static_cast<const char*>(RTA_DATA(a)), RTA_PAYLOAD(a));
}

// The attributes after a message's fixed part of `fixed` bytes.
template <typename F>
void ForEachAttribute(const nlmsghdr* h, size_t fixed, F f) {
  if (h->nlmsg_len < NLMSG_LENGTH(fixed)) return;
  ForEachAttribute(static_cast<const char*>(NLMSG_DATA(h)) + NLMSG_ALIGN(fixed),
                   static_cast<int>(h->nlmsg_len - NLMSG_LENGTH(NLMSG_ALIGN(fixed))), f);
}

// An rtnetlink socket of the calling thread's namespace. Every answer arrives within
// kNetlinkTimeoutMs and an exchange takes at most kMaxNetnsEntries messages.
class Rtnl {
 public:
  bool Open(std::string* error) {
    fd_ = OpenNetlink(NETLINK_ROUTE, "rtnetlink in the client's namespace", error);
    return static_cast<bool>(fd_);
  }
  // Sends `req` and hands each answer to `each`: all of a dump, or the one answer.
  bool Exchange(nlmsghdr* req, const Each& each, std::string* error);

 private:
  bool Receive(ssize_t* n, std::string* error);

  UniqueFd fd_;
  uint32_t seq_ = 0;
  std::vector<char> buf_ = std::vector<char>(64 * 1024);
};

bool Rtnl::Receive(ssize_t* n, std::string* error) {
  iovec iov{buf_.data(), buf_.size()};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  *n = ::recvmsg(fd_.get(), &m, 0);
  if (*n <= 0 || (m.msg_flags & MSG_TRUNC) != 0) {
    *error = std::string("rtnetlink in the client's namespace: ") +
             (*n < 0 ? std::strerror(errno) : "a truncated or empty answer");
    return false;
  }
  return true;
}

bool Rtnl::Exchange(nlmsghdr* req, const Each& each, std::string* error) {
  req->nlmsg_seq = ++seq_;
  const bool dump = (req->nlmsg_flags & NLM_F_DUMP) == NLM_F_DUMP;
  if (::send(fd_.get(), req, req->nlmsg_len, 0) != static_cast<ssize_t>(req->nlmsg_len)) {
    *error = std::string("rtnetlink request failed: ") + std::strerror(errno);
    return false;
  }
  size_t messages = 0;
  for (size_t reads = 0; reads <= kMaxNetnsEntries; ++reads) {
    ssize_t n = 0;
    if (!Receive(&n, error)) return false;
    int len = static_cast<int>(n);
    for (auto* h = reinterpret_cast<const nlmsghdr*>(buf_.data()); NLMSG_OK(h, len);
         h = NLMSG_NEXT(h, len)) {
      if (h->nlmsg_seq != req->nlmsg_seq) continue;
      if (h->nlmsg_type == NLMSG_DONE) return true;
      if (h->nlmsg_type == NLMSG_ERROR) {
        const auto* e = static_cast<const nlmsgerr*>(NLMSG_DATA(h));
        *error = std::string("rtnetlink in the client's namespace: ") + std::strerror(-e->error);
        return false;
      }
      if (++messages > kMaxNetnsEntries) {
        *error = "the client's network namespace holds more than " +
                 std::to_string(kMaxNetnsEntries) + " interfaces or addresses";
        return false;
      }
      each(h);
      if (!dump) return true;
    }
  }
  *error = "rtnetlink in the client's namespace does not end its answer";
  return false;
}

struct Link {
  std::string name;
  unsigned flags = 0;
  int32_t partner_nsid = NETNSA_NSID_NOT_ASSIGNED;  // IFLA_LINK_NETNSID, if any
};

// Asks for every object of `type` (RTM_GETLINK, RTM_GETADDR) of `family`.
bool Dump(Rtnl& nl, uint16_t type, unsigned char family, const Each& each, std::string* error) {
  struct {
    nlmsghdr h;
    rtgenmsg g;
  } q{};
  q.h.nlmsg_len = NLMSG_LENGTH(sizeof(rtgenmsg));
  q.h.nlmsg_type = type;
  q.h.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
  q.g.rtgen_family = family;
  return nl.Exchange(&q.h, each, error);
}

bool DumpLinks(Rtnl& nl, std::unordered_map<int, Link>* links, std::string* error) {
  return Dump(
      nl, RTM_GETLINK, AF_UNSPEC,
      [&](const nlmsghdr* h) {
        if (h->nlmsg_type != RTM_NEWLINK || h->nlmsg_len < NLMSG_LENGTH(sizeof(ifinfomsg))) return;
        const auto* ifi = static_cast<const ifinfomsg*>(NLMSG_DATA(h));
        Link l;
        l.flags = ifi->ifi_flags;
        ForEachAttribute(h, sizeof(ifinfomsg), [&](int type, const char* data, size_t bytes) {
          if (type == IFLA_IFNAME) l.name.assign(data, ::strnlen(data, bytes));
          if (type == IFLA_LINK_NETNSID && bytes >= sizeof(int32_t))
            std::memcpy(&l.partner_nsid, data, sizeof(int32_t));
        });
        (*links)[ifi->ifi_index] = std::move(l);
      },
      error);
}

struct Address {
  int index = 0;
  uint32_t ip = 0;  // host byte order
};

bool DumpAddresses(Rtnl& nl, std::vector<Address>* out, std::string* error) {
  return Dump(
      nl, RTM_GETADDR, AF_INET,
      [&](const nlmsghdr* h) {
        if (h->nlmsg_type != RTM_NEWADDR || h->nlmsg_len < NLMSG_LENGTH(sizeof(ifaddrmsg))) return;
        const auto* ifa = static_cast<const ifaddrmsg*>(NLMSG_DATA(h));
        if (ifa->ifa_family != AF_INET) return;
        // IFA_LOCAL is the address itself; IFA_ADDRESS is the peer on point-to-point links.
        uint32_t local = 0, address = 0;
        ForEachAttribute(h, sizeof(ifaddrmsg), [&](int type, const char* data, size_t bytes) {
          if (bytes < sizeof(uint32_t)) return;
          if (type == IFA_LOCAL) std::memcpy(&local, data, sizeof(local));
          if (type == IFA_ADDRESS) std::memcpy(&address, data, sizeof(address));
        });
        out->push_back({static_cast<int>(ifa->ifa_index), ntohl(local != 0 ? local : address)});
      },
      error);
}

// The id under which the calling thread's namespace knows the router's namespace
// (NETNSA_NSID_NOT_ASSIGNED when no interface here is linked to it).
bool RouterNsid(Rtnl& nl, int router_netns, int32_t* id, std::string* error) {
  constexpr size_t kBody = NLMSG_ALIGN(sizeof(rtgenmsg)) + RTA_SPACE(sizeof(uint32_t));
  alignas(nlmsghdr) char req[NLMSG_SPACE(kBody)] = {};
  auto* h = reinterpret_cast<nlmsghdr*>(req);
  h->nlmsg_len = NLMSG_LENGTH(kBody);
  h->nlmsg_type = RTM_GETNSID;
  h->nlmsg_flags = NLM_F_REQUEST;
  static_cast<rtgenmsg*>(NLMSG_DATA(h))->rtgen_family = AF_UNSPEC;
  auto* a =
      reinterpret_cast<rtattr*>(static_cast<char*>(NLMSG_DATA(h)) + NLMSG_ALIGN(sizeof(rtgenmsg)));
  a->rta_type = NETNSA_FD;
  a->rta_len = RTA_LENGTH(sizeof(uint32_t));
  const uint32_t fd = static_cast<uint32_t>(router_netns);
  std::memcpy(RTA_DATA(a), &fd, sizeof(fd));
  *id = NETNSA_NSID_NOT_ASSIGNED;
  return nl.Exchange(
      h,
      [&](const nlmsghdr* r) {
        if (r->nlmsg_type != RTM_NEWNSID) return;
        ForEachAttribute(r, sizeof(rtgenmsg), [&](int type, const char* data, size_t bytes) {
          if (type == NETNSA_NSID && bytes >= sizeof(int32_t)) std::memcpy(id, data, sizeof(*id));
        });
      },
      error);
}

}  // namespace

UniqueFd OpenNetlink(int protocol, const char* what, std::string* error) {
  UniqueFd fd(::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, protocol));
  const timeval tv{kNetlinkTimeoutMs / 1000, (kNetlinkTimeoutMs % 1000) * 1000};
  if (!fd || ::setsockopt(fd.get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0) {
    *error = std::string("cannot open ") + what + ": " + std::strerror(errno);
    return UniqueFd();
  }
  return fd;
}

bool RunInNamespace(int nsfd, const NamespaceWork& work, std::string* error) {
  std::string err;
  auto run = [&] {
    if (::setns(nsfd, CLONE_NEWNET) != 0) {
      err = std::string("cannot enter the client's network namespace: ") + std::strerror(errno);
      return;
    }
    struct stat st {};
    if (::stat("/proc/thread-self/ns/net", &st) != 0) {
      err = std::string("cannot name the client's network namespace: ") + std::strerror(errno);
      return;
    }
    work(st.st_dev, st.st_ino, &err);
  };
  try {
    std::thread worker(run);
    worker.join();
  } catch (const std::system_error& e) {
    *error =
        std::string("cannot start a thread to enter the client's network namespace: ") + e.what();
    return false;
  }
  if (!err.empty()) *error = err;
  return err.empty();
}

bool OpenPeerNamespace(int sock, uint64_t expect_ino, UniqueFd* out, std::string* error) {
  PeerProcess peer;
  if (!FindPeerProcess(sock, true, &peer, error)) return false;
  return RunInNamespace(
      peer.namespace_handle(),
      [&](dev_t, ino_t ino, std::string* err) {
        if (ino != expect_ino) {
          *err = "its network namespace is not the one it was identified in";
          return;
        }
        UniqueFd ns(::open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC));
        struct stat st {};
        if (!ns || ::fstat(ns.get(), &st) != 0) {
          *err = std::string("cannot open the client's network namespace: ") + std::strerror(errno);
        } else if (st.st_ino != ino) {
          *err = "its network namespace changed while the router opened it";
        } else {
          *out = std::move(ns);
        }
      },
      error);
}

bool ReadNamespaceAddresses(int router_netns, std::vector<InterfaceAddress>* out,
                            std::string* error) {
  Rtnl nl;
  std::unordered_map<int, Link> links;
  std::vector<Address> addresses;
  int32_t router_id = NETNSA_NSID_NOT_ASSIGNED;
  // Links first: listing an interface whose partner is in another namespace gives that
  // namespace an id here, which RouterNsid then reads.
  if (!nl.Open(error) || !DumpLinks(nl, &links, error) ||
      !RouterNsid(nl, router_netns, &router_id, error) || !DumpAddresses(nl, &addresses, error))
    return false;
  for (const Address& a : addresses) {
    const auto link = links.find(a.index);
    if (link == links.end()) continue;  // the interface went away between the two dumps
    const bool linked =
        router_id != NETNSA_NSID_NOT_ASSIGNED && link->second.partner_nsid == router_id;
    out->push_back({link->second.name, link->second.flags, a.ip, linked});
  }
  return true;
}

}  // namespace ff::router
