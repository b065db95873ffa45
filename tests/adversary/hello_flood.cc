// Issue 37, attacks 2 and 3: a connection flood used to stall the router for every pod of
// its node, and its links to other routers with it. The router identified each new client
// (a thread that enters the client's network namespace and reads every address there) on
// the thread that serves identified pods, for up to 64 connections a turn, before any
// quota applied. A pod that adds thousands of addresses to an interface of its own namespace
// (NET_ADMIN there is allowed) makes each identification cost milliseconds; connecting
// again and again then held well-behaved pods' requests for seconds, and the peer router
// declared the link silent.
//
// The attacker adds kExtraAddresses addresses outside the overlay to its loopback
// interface (identification reads them all, then finds the pod's one overlay address), and
// connects to its router's socket from kThreads threads, each keeping kHeld connections
// open and replacing the oldest, as fast as the router takes them, until the script has
// measured (adversary.sh: a fresh pod's HELLO, ping-pongs on the node and across nodes, an
// ib_send_lat across nodes through this router). It checks that it made the router take
// many connections: what must hold is checked by the script.
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <thread>

#include "adversary.h"

namespace ff::adversary {
namespace {

constexpr size_t kExtraAddresses = 3000;
// One thread keeps the router's gate full (it waits with 255 connections, identifying one
// every few milliseconds); more would only spend this pod's own CPU, which on a real node its
// limit bounds and here would compete with the measured pods for the machine's two cores.
constexpr int kThreads = 1;
constexpr size_t kHeld = 256;
constexpr auto kFloodLimit = std::chrono::seconds(90);
// Fewer connections than this and the router was not flooded: no attack.
constexpr uint64_t kEnough = 1000;

std::string RouterPath() {
  const char* dir = std::getenv("FREEFLOW_DIR");
  const char* name = std::getenv("FFR_NAME");
  return std::string(dir != nullptr ? dir : "/freeflow") + "/" +
         (name != nullptr ? name : "ffrouter") + ".sock";
}

// Runs `ip -batch` with `lines` in this pod's network namespace; true when all worked.
bool IpBatch(const std::vector<std::string>& lines) {
  FILE* p = ::popen("ip -batch - >/dev/null 2>&1", "w");
  if (p == nullptr) return false;
  for (const std::string& l : lines) std::fprintf(p, "%s\n", l.c_str());
  return ::pclose(p) == 0;
}

std::vector<std::string> AddressLines(const char* verb) {
  std::vector<std::string> lines;
  for (size_t i = 0; i < kExtraAddresses; ++i) {
    lines.push_back(std::string("addr ") + verb + " 172.30." + std::to_string(i / 250) + "." +
                    std::to_string(i % 250 + 1) + "/32 dev lo");
  }
  return lines;
}

// Connections to the router, kHeld open at once, each replaced as soon as it is made.
uint64_t Flood(const std::string& path, const std::atomic<bool>& stop) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), std::min(path.size(), sizeof(addr.sun_path) - 1));
  std::deque<UniqueFd> held;
  uint64_t made = 0;
  const auto end = std::chrono::steady_clock::now() + kFloodLimit;
  while (!stop.load() && std::chrono::steady_clock::now() < end) {
    UniqueFd s(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
    if (!s) break;
    // Blocking: a full backlog holds the attacker until the router takes one.
    if (::connect(s.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      break;
    }
    ++made;
    held.push_back(std::move(s));
    if (held.size() > kHeld) held.pop_front();
  }
  return made;
}

}  // namespace

int HelloFlood(const Args& a) {
  Report r("37.2", "hello-flood");
  const Rendezvous rv(a.meet);
  {
    RawPod pod = OpenPod();
    const int st = pod.Hello(Abi());
    if (st != 0) {
      r.Check(false, "setting up", "HELLO: " + ErrName(st));
      return Conclude(r, rv);
    }
  }
  const bool added = IpBatch(AddressLines("add"));
  if (!added) {
    r.Check(false, "setting up", "could not add " + std::to_string(kExtraAddresses) + " addresses");
    return Conclude(r, rv);
  }
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> made{0};
  std::vector<std::thread> threads;
  const std::string path = RouterPath();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kThreads; ++i) threads.emplace_back([&] { made += Flood(path, stop); });
  std::this_thread::sleep_for(std::chrono::seconds(1));  // the flood is on
  rv.Put("holding", "");
  rv.Get("release", std::chrono::seconds(80));
  stop.store(true);
  for (std::thread& t : threads) t.join();
  const auto secs =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - start)
          .count();
  IpBatch(AddressLines("del"));
  r.Check(made.load() >= kEnough,
          std::to_string(kThreads) + " thread(s) connecting to " + path +
              " as fast as it takes them (" + std::to_string(kHeld) +
              " open each) from a namespace with " + std::to_string(kExtraAddresses) +
              " more addresses",
          std::to_string(made.load()) + " connections in " + std::to_string(secs) + " s" +
              (made.load() >= kEnough ? "" : " (too few to flood it)"));
  const int status = r.Finish();
  rv.Put("done", "");
  return status;
}

}  // namespace ff::adversary
