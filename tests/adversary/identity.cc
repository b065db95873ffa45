// Finding 6: a pod takes another pod's identity. The router used to take the first overlay
// address it found in the caller's network namespace, so a pod with NET_ADMIN (which this
// attacker holds in its own namespace) could add the victim's address and be served as the
// victim, and a host-network process was served as the bridge's address. The attacker
// tries, each time with a fresh HELLO:
//   - the victim's address on its loopback;
//   - the victim's address next to its own on its interface;
//   - its interface renumbered onto the victim's address (the victim is connected);
//   - a network namespace of its own (a veth pair in it, with the victim's address);
//   - through its helper, a process with host networking on the victim's node.
// Each must be refused with EACCES; afterwards, with its own address back, it is served as
// itself again. Every change to the attacker's namespace is undone before it concludes.
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "adversary.h"
#include "freeflow/ipv4.h"

namespace ff::adversary {
namespace {

// Runs a shell command line (iproute2); true when it exited 0.
bool Sh(const std::string& line) {
  const int st = std::system((line + " >/dev/null 2>&1").c_str());
  return st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

// What a command printed (at most 64 KiB).
std::string Capture(const std::string& line) {
  std::string out;
  if (FILE* p = ::popen(line.c_str(), "r")) {
    char buf[4096];
    for (size_t n; out.size() < (64u << 10) && (n = std::fread(buf, 1, sizeof(buf), p)) > 0;)
      out.append(buf, n);
    ::pclose(p);
  }
  return out;
}

// This pod's interface, its address with prefix length, and its default gateway.
struct Own {
  std::string ifname;
  std::string ip;  // dotted
  std::string prefix_len;
  std::string gateway;
};

std::optional<Own> FindOwn(uint32_t ip) {
  const std::string dotted = FormatIpv4(ip);
  std::istringstream lines(Capture("ip -4 -o addr show"));
  Own own;
  for (std::string line; std::getline(lines, line);) {
    std::istringstream f(line);
    std::string index, ifname, family, cidr;
    if (!(f >> index >> ifname >> family >> cidr) || cidr.rfind(dotted + "/", 0) != 0) continue;
    own.ifname = ifname;
    own.ip = dotted;
    own.prefix_len = cidr.substr(dotted.size() + 1);
  }
  std::istringstream route(Capture("ip -4 route show default"));
  std::string word;
  while (route >> word) {
    if (word == "via") route >> own.gateway;
  }
  if (own.ifname.empty() || own.gateway.empty()) return std::nullopt;
  return own;
}

// A fresh HELLO: its status, and the reason the router gave.
int Hello(std::string* reason) {
  RawPod pod = OpenPod();
  const int st = pod.Hello(Abi());
  const auto& node = pod.hello().node;
  *reason = std::string(node, ::strnlen(node, sizeof(node)));
  return st;
}

void ExpectRefused(Report& r, const std::string& tried, bool set_up) {
  if (!set_up) {
    r.Check(false, tried, "could not set the attack up (iproute2 failed)");
    return;
  }
  std::string reason;
  const int st = Hello(&reason);
  r.Check(st == EACCES, tried, ErrName(st) + (reason.empty() ? "" : ": " + reason));
}

// What a container's root without CAP_SYS_ADMIN can do: a user namespace (in which it is
// root, mapped to itself) with a network namespace it owns.
bool EnterOwnNamespace() {
  if (::unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0) return false;
  auto put = [](const char* file, const char* text) {
    std::ofstream out(file);
    out << text;
    out.flush();
    return out.good();
  };
  return put("/proc/self/setgroups", "deny") && put("/proc/self/uid_map", "0 0 1") &&
         put("/proc/self/gid_map", "0 0 1");
}

// A namespace the attacker makes itself, with the victim's address on a veth pair in it: the
// HELLO of a child that moved into it. Its status in the upper bits of the exit code; the
// low ones say whether the set-up worked.
void OwnNamespace(Report& r, const std::string& victim_cidr) {
  int pipefd[2];
  if (::pipe(pipefd) != 0) return r.Check(false, "a namespace of its own", "no pipe");
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(pipefd[0]);
    std::string line = "-1 no namespace";
    if (EnterOwnNamespace()) {
      const bool up = Sh("ip link set lo up") &&
                      Sh("ip link add ffspoof type veth peer name ffspoof1") &&
                      Sh("ip addr add " + victim_cidr + " dev ffspoof") &&
                      Sh("ip link set ffspoof1 up") && Sh("ip link set ffspoof up");
      std::string reason;
      const int st = up ? Hello(&reason) : -2;
      line = std::to_string(st) + " " + reason;
    }
    (void)!::write(pipefd[1], line.data(), line.size());
    ::_exit(0);
  }
  ::close(pipefd[1]);
  std::string got;
  char buf[512];
  for (ssize_t n; (n = ::read(pipefd[0], buf, sizeof(buf))) > 0;) got.append(buf, n);
  ::close(pipefd[0]);
  int wst = 0;
  if (child > 0) ::waitpid(child, &wst, 0);
  std::istringstream in(got);
  int st = -1;
  in >> st;
  std::string reason;
  std::getline(in, reason);
  const std::string tried = "a network namespace of its own, the victim's address on a veth in it";
  if (st == -2) return r.Check(false, tried, "could not set the attack up (iproute2 failed)");
  r.Check(st == EACCES, tried, ErrName(st) + (reason.empty() ? "" : ":" + reason));
}

}  // namespace

int Identity(const Args& a) {
  Report r("6", "identity");
  const Rendezvous rv(a.meet);
  std::optional<Own> own;
  std::optional<Victim> victim;
  {
    auto start = OpenAgainstVictim(a, r);
    if (!start) return r.Finish();
    victim = start->victim;
    own = FindOwn(OwnIp(start->pod));
  }  // the attacker's own session ends before it changes its namespace
  if (!own) {
    r.Check(false, "setting up", "could not read this pod's interface and gateway");
    return Conclude(r, rv);
  }
  const std::string v = FormatIpv4(victim->ip);
  const std::string dev = " dev " + own->ifname;
  const std::string v_cidr = v + "/" + own->prefix_len;
  const std::string own_cidr = own->ip + "/" + own->prefix_len;

  ExpectRefused(r, "the victim's address " + v + " on lo", Sh("ip addr add " + v + "/32 dev lo"));
  Sh("ip addr del " + v + "/32 dev lo");

  ExpectRefused(r, "the victim's address next to its own on " + own->ifname,
                Sh("ip addr add " + v_cidr + dev));
  Sh("ip addr del " + v_cidr + dev);

  ExpectRefused(r, own->ifname + " renumbered from " + own->ip + " to the victim's " + v,
                Sh("ip addr del " + own_cidr + dev) && Sh("ip addr add " + v_cidr + dev));
  Sh("ip addr del " + v_cidr + dev);
  const bool restored = Sh("ip addr add " + own_cidr + dev) &&
                        Sh("ip route replace default via " + own->gateway + dev);

  OwnNamespace(r, v_cidr);

  // The helper: a process with host networking on this node (the script starts it).
  rv.Put("host-go", "");
  const auto host = rv.Get("host-result");
  std::istringstream in(host.value_or("-1"));
  int st = -1;
  in >> st;
  std::string reason;
  std::getline(in, reason);
  r.Check(st == EACCES, "a host-network process on the victim's node (its helper)",
          ErrName(st) + reason);

  RawPod pod = OpenPod();
  const int hello = pod.Hello(Abi());
  r.Check(restored && hello == 0 && FormatIpv4(OwnIp(pod)) == own->ip,
          "its own address back: served as itself",
          std::string(restored ? "" : "could not restore its address; ") + "HELLO " +
              ErrName(hello) + " as " + FormatIpv4(OwnIp(pod)));
  return Conclude(r, rv);
}

// The helper of `identity`, run with host networking on the attacked node: one HELLO, its
// status and reason for the attacker.
int IdentityHost(const Args& a) {
  const Rendezvous rv(a.meet);
  if (!rv.Get("host-go")) return 2;
  std::string reason;
  const int st = Hello(&reason);
  rv.Put("host-result", std::to_string(st) + " " + reason);
  std::printf("host: HELLO %s %s\n", ErrName(st).c_str(), reason.c_str());
  rv.Get("done", std::chrono::seconds(90));
  return 0;
}

}  // namespace ff::adversary
