// Issue 37, attacks 6 and 7: anything on the node network floods a router's node port with
// connections that never authenticate and come back as soon as the router closes them. The
// router used to refuse new connections while 64 were pending, so 72 idle ones kept other
// routers from linking for as long as they went on, and it logged a line per refusal.
//
// The attacker (a pod of node 0) opens kPerAddress connections from its own address and
// from each of kExtraAddresses it adds to its interface; the helper (host networking on node
// 0, so the address node 0's router dials from) opens kPerAddress more. Both reconnect every
// connection the router closes, as fast as they can, until the script has checked that
// another router links to the flooded one through the flood (adversary.sh). Then both stop
// reconnecting, and the attacker checks what the router holds of its connections: at most
// kMaxPendingNodeLinksPerSource from one address, at most kMaxPendingNodeLinks in all, none
// once the handshake timeout has passed.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>
#include <thread>

#include "adversary.h"
#include "freeflow/ipv4.h"
#include "freeflow/tunables.h"

namespace ff::adversary {
namespace {

constexpr size_t kExtraAddresses = 15;
constexpr size_t kPerAddress = 8;  // twice the router's bound per address
constexpr auto kFloodLimit = std::chrono::seconds(90);
// The router's bound for a handshake (kDialTimeoutNs) with room for its timer's period.
constexpr auto kHandshakeBound = std::chrono::seconds(7);

bool Sh(const std::string& line) {
  const int st = std::system((line + " >/dev/null 2>&1").c_str());
  return st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

struct Target {
  sockaddr_in addr{};
  std::string text;
};

std::optional<Target> ReadTarget(const Rendezvous& rv) {
  const auto value = rv.Get("target");
  if (!value) return std::nullopt;
  std::istringstream in(*value);
  std::string ip;
  unsigned port = 0;
  Target t;
  if (!(in >> ip >> port) || port == 0 || port > 65535 ||
      ::inet_pton(AF_INET, ip.c_str(), &t.addr.sin_addr) != 1)
    return std::nullopt;
  t.addr.sin_family = AF_INET;
  t.addr.sin_port = htons(static_cast<uint16_t>(port));
  t.text = ip + ":" + std::to_string(port);
  return t;
}

// Connections from a set of source addresses, each reopened when the router closes it.
class Flood {
 public:
  Flood(const Target& target, std::vector<uint32_t> sources) : target_(target) {
    for (uint32_t s : sources)
      for (size_t i = 0; i < kPerAddress; ++i) conns_.push_back({s, Open(s)});
  }

  // Reopens closed connections until `stop` or kFloodLimit; returns how many it reopened.
  uint64_t Run(const std::atomic<bool>& stop) {
    const auto end = std::chrono::steady_clock::now() + kFloodLimit;
    std::vector<pollfd> fds(conns_.size());
    while (!stop.load() && std::chrono::steady_clock::now() < end) {
      for (size_t i = 0; i < conns_.size(); ++i) {
        fds[i] = {conns_[i].fd.get(), POLLIN | POLLRDHUP, 0};
      }
      if (::poll(fds.data(), fds.size(), 10) <= 0) continue;
      for (size_t i = 0; i < conns_.size(); ++i) {
        if (fds[i].revents == 0) continue;
        conns_[i].fd = Open(conns_[i].source);
        ++reopened_;
      }
    }
    return reopened_;
  }

  // Gives up the connections whose connect has not completed (their SYN waits for the
  // router's backlog to have room), and sends one byte on the others: a connection whose
  // last ACK the router's kernel dropped while its accept queue was full looks established
  // here but is not there until a segment completes it. Then what is open here is what the
  // router holds, once it has taken what its queue holds.
  void Settle() {
    for (Conn& c : conns_) {
      if (!Established(c.fd.get())) {
        c.fd.reset();
      } else {
        ::send(c.fd.get(), "x", 1, MSG_DONTWAIT | MSG_NOSIGNAL);
      }
    }
  }

  // The connections the router holds open (established, not closed by the router), per
  // source address.
  std::map<uint32_t, size_t> OpenPerSource() const {
    std::map<uint32_t, size_t> open;
    for (const Conn& c : conns_) {
      if (c.fd && Established(c.fd.get())) ++open[c.source];
    }
    return open;
  }

 private:
  struct Conn {
    uint32_t source;  // host order
    UniqueFd fd;
  };
  static bool Established(int fd) {
    tcp_info info{};
    socklen_t len = sizeof(info);
    return ::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) == 0 &&
           info.tcpi_state == TCP_ESTABLISHED;
  }
  UniqueFd Open(uint32_t source) const {
    UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    sockaddr_in src{};
    src.sin_family = AF_INET;
    src.sin_addr.s_addr = htonl(source);
    if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&src), sizeof(src)) != 0) return fd;
    ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&target_.addr), sizeof(target_.addr));
    return fd;
  }

  Target target_;
  std::vector<Conn> conns_;
  uint64_t reopened_ = 0;
};

}  // namespace

int PortFlood(const Args& a) {
  Report r("37.6", "port-flood");
  const Rendezvous rv(a.meet);
  const auto target = ReadTarget(rv);
  uint32_t own = 0;
  {
    RawPod pod = OpenPod();
    if (pod.Hello(Abi()) == 0) own = OwnIp(pod);
  }
  if (!target || own == 0) {
    r.Check(false, "setting up", target ? "no HELLO answer: no own address" : "no target");
    rv.Put("holding", "");
    return r.Finish();
  }
  // Addresses of its own subnet (/24) the suite's pods do not use, on its interface.
  std::vector<uint32_t> sources{own};
  std::vector<std::string> added;
  for (size_t i = 0; i < kExtraAddresses; ++i) {
    const uint32_t extra = (own & 0xffffff00u) | static_cast<uint32_t>(200 + i);
    const std::string cidr = FormatIpv4(extra) + "/24";
    if (!Sh("ip addr add " + cidr + " dev eth0")) continue;
    added.push_back(cidr);
    sources.push_back(extra);
  }
  Flood flood(*target, sources);
  std::atomic<bool> stop{false};
  uint64_t reopened = 0;
  std::thread t([&] { reopened = flood.Run(stop); });
  std::this_thread::sleep_for(std::chrono::seconds(1));  // the router's table is full
  rv.Put("holding", "");
  rv.Get("release", std::chrono::seconds(60));
  stop.store(true);
  t.join();
  flood.Settle();
  rv.Put("stopped", "");
  r.Check(
      reopened > 0,
      std::to_string(sources.size() * kPerAddress) + " connections from " +
          std::to_string(sources.size()) + " addresses to " + target->text +
          ", reopened as soon as closed",
      "the router took new ones and closed older ones: " + std::to_string(reopened) + " reopened");
  // What the router holds once the flood has stopped and it has taken the last ones.
  std::this_thread::sleep_for(std::chrono::seconds(1));
  size_t most = 0, total = 0;
  for (const auto& [source, n] : flood.OpenPerSource()) {
    most = std::max(most, n);
    total += n;
  }
  r.Check(most <= kMaxPendingNodeLinksPerSource && total <= kMaxPendingNodeLinks,
          "more than the router's bounds open at once",
          "it holds " + std::to_string(total) + " (bound " + std::to_string(kMaxPendingNodeLinks) +
              "), at most " + std::to_string(most) + " from one address (bound " +
              std::to_string(kMaxPendingNodeLinksPerSource) + ")");
  const bool expired =
      test::WaitFor([&] { return flood.OpenPerSource().empty(); },
                    std::chrono::duration_cast<std::chrono::milliseconds>(kHandshakeBound));
  r.Check(expired, "holding them open without a handshake",
          expired ? "all closed within " + std::to_string(kHandshakeBound.count()) + " s"
                  : "some still open after " + std::to_string(kHandshakeBound.count()) + " s");
  for (const std::string& cidr : added) Sh("ip addr del " + cidr + " dev eth0");
  const int status = r.Finish();
  rv.Put("done", "");
  return status;
}

// The helper of `port-flood`, with host networking on node 0: the same flood from the
// address node 0's router dials from (the kernel's choice for the route to the target),
// until the attacker has stopped.
int PortFloodHost(const Args& a) {
  const Rendezvous rv(a.meet);
  const auto target = ReadTarget(rv);
  if (!target) {
    std::fprintf(stderr, "host: no target\n");
    return 2;
  }
  Flood flood(*target, {INADDR_ANY});
  std::atomic<bool> stop{false};
  uint64_t reopened = 0;
  std::thread t([&] { reopened = flood.Run(stop); });
  rv.Get("stopped", kFloodLimit);
  stop.store(true);
  t.join();
  std::printf("host: %zu connections from the node's address, reopened %llu times\n", kPerAddress,
              static_cast<unsigned long long>(reopened));
  return 0;
}

}  // namespace ff::adversary
