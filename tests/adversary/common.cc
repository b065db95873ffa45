// What the attacks share: how their processes meet, how they report, how they reach the
// router and the victim.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "adversary.h"
#include "freeflow/ipv4.h"

namespace ff::adversary {
namespace {

std::string Env(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : fallback;
}

// Maps what `fd` holds (at most 64 MiB), read-only or writable; an empty Mapping when it
// cannot be mapped so.
Mapping MapWhole(int fd, bool writable) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size <= 0) return Mapping();
  const size_t len = std::min<size_t>(static_cast<size_t>(st.st_size), size_t{64} << 20);
  void* p = ::mmap(nullptr, len, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
  return p == MAP_FAILED ? Mapping() : Mapping(p, len);
}

char* FindMarker(const Mapping& m) {
  return static_cast<char*>(::memmem(m.get(), m.size(), kSecretMarker, sizeof(kSecretMarker) - 1));
}

}  // namespace

Rendezvous::Rendezvous(std::string dir) : dir_(std::move(dir)) { ::mkdir(dir_.c_str(), 0755); }

void Rendezvous::Put(const std::string& key, const std::string& value) const {
  const std::string path = dir_ + "/" + key;
  {
    std::ofstream out(path + ".tmp", std::ios::trunc);
    out << value;
  }
  std::rename((path + ".tmp").c_str(), path.c_str());
}

std::optional<std::string> Rendezvous::Get(const std::string& key,
                                           std::chrono::milliseconds timeout) const {
  const std::string path = dir_ + "/" + key;
  if (!test::WaitFor([&] { return ::access(path.c_str(), F_OK) == 0; }, timeout))
    return std::nullopt;
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void Report::Check(bool held, const std::string& tried, const std::string& got) {
  lines_.push_back({held, tried, got});
  std::printf("  %s %s -> %s\n", held ? "held:  " : "BROKEN:", tried.c_str(), got.c_str());
  std::fflush(stdout);
}

int Report::Finish() const {
  for (const Line& l : lines_) {
    if (l.held) continue;
    std::printf("BREACHED %s %s: %s -> %s\n", finding_.c_str(), name_.c_str(), l.tried.c_str(),
                l.got.c_str());
    return 1;
  }
  if (lines_.empty()) {
    std::printf("BREACHED %s %s: nothing was checked -> no verdict\n", finding_.c_str(),
                name_.c_str());
    return 1;
  }
  std::printf("DEFENDED %s %s: %zu attempts (above) -> every one failed\n", finding_.c_str(),
              name_.c_str(), lines_.size());
  return 0;
}

RawPod OpenPod() {
  const std::string path =
      Env("FREEFLOW_DIR", "/freeflow") + "/" + Env("FFR_NAME", "ffrouter") + ".sock";
  UniqueFd sock = test::ConnectToRouter(path);
  if (!sock) {
    std::fprintf(stderr, "no router at %s: %s\n", path.c_str(), std::strerror(errno));
    std::exit(2);
  }
  return RawPod(std::move(sock));
}

uint32_t Abi() {
  const char* v = std::getenv("ADV_ABI");
  return v != nullptr ? static_cast<uint32_t>(std::strtoul(v, nullptr, 10)) : kAbiVersion;
}

std::string ErrName(int status) {
  if (status == 0) return "0 (accepted)";
  if (status < 0) return "no answer";
  const char* name = ::strerrorname_np(status);
  return name != nullptr ? name : std::to_string(status);
}

std::string Tally(const std::vector<int>& statuses) {
  std::map<int, int> counts;
  for (int s : statuses) ++counts[s];
  std::string out;
  for (const auto& [status, n] : counts)
    out += (out.empty() ? "" : ", ") + ErrName(status) + " x" + std::to_string(n);
  return out;
}

std::string WcName(int status) {
  if (status == -1) return "no answer";
  if (status == -2) return "connect refused";
  return ::ibv_wc_status_str(static_cast<ibv_wc_status>(status));
}

uint32_t OwnIp(const RawPod& pod) { return ntohl(pod.hello().ip); }

bool HoldsSecret(int fd) {
  const Mapping m = MapWhole(fd, false);
  return m.get() != nullptr && FindMarker(m) != nullptr;
}

bool OverwriteSecret(int fd) {
  const Mapping ro = MapWhole(fd, false);
  const char* at = ro.get() != nullptr ? FindMarker(ro) : nullptr;
  if (at == nullptr) return false;
  const auto offset = static_cast<off_t>(at - ro.as<char>());
  const Mapping rw = MapWhole(fd, true);
  if (rw.get() != nullptr) {
    std::memcpy(rw.as<char>() + offset, "PWNED", 5);
    return true;
  }
  return ::pwrite(fd, "PWNED", 5, offset) == 5;
}

std::optional<Victim> FindVictim(const std::string& dir, const std::string& file) {
  const auto text = Rendezvous(dir).Get(file);
  if (!text) return std::nullopt;
  std::istringstream in(*text);
  std::string ip;
  Victim v;
  if (!(in >> ip >> v.rc_qpn >> v.ud_qpn)) return std::nullopt;
  const auto parsed = ParseIpv4(ip);
  if (!parsed) return std::nullopt;
  v.ip = *parsed;
  return v;
}

std::optional<Opening> OpenAgainstVictim(const Args& a, Report& r) {
  const auto victim = FindVictim(a.dir);
  RawPod pod = OpenPod();
  const int hello = pod.Hello(Abi());
  if (!victim || hello != 0) {
    r.Check(false, "setting up", victim ? "HELLO: " + ErrName(hello) : "no victim found");
    return std::nullopt;
  }
  return Opening{std::move(pod), *victim};
}

std::optional<Peer> MeetPeer(const Rendezvous& rv, RawPod& pod, const std::vector<RawQp*>& ours) {
  std::string mine = std::to_string(OwnIp(pod));
  for (const RawQp* qp : ours) mine += " " + std::to_string(qp->qpn);
  rv.Put("attacker", mine);
  const auto text = rv.Get("peer");
  if (!text) return std::nullopt;
  std::istringstream in(*text);
  Peer p;
  if (!(in >> p.ip >> p.rkey >> p.addr)) return std::nullopt;
  for (uint32_t qpn; in >> qpn;) p.qpns.push_back(qpn);
  if (p.qpns.size() != ours.size()) return std::nullopt;
  for (size_t i = 0; i < ours.size(); ++i) pod.Name(*ours[i], p.ip, p.qpns[i]);
  rv.Put("named", "");
  return p;
}

std::vector<int> PeerResults(const Rendezvous& rv, size_t count) {
  std::vector<int> out;
  if (const auto text = rv.Get("peer-result")) {
    std::istringstream in(*text);
    for (int s; in >> s;) out.push_back(s);
  }
  out.resize(count, -1);
  return out;
}

RawLink ConnectTo(RawPod& pod, const RawQp& qp, uint32_t ip, uint32_t qpn) {
  RawLink link;
  for (int attempt = 0; attempt < 250; ++attempt) {
    link = pod.Connect(qp, ip, qpn);
    if (link.status != EINPROGRESS) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return link;
}

int Conclude(const Report& r, const Rendezvous& rv) {
  const int status = r.Finish();
  rv.Put("holding", "");
  rv.Get("release", std::chrono::seconds(60));
  rv.Put("done", "");
  return status;
}

}  // namespace ff::adversary
