// Finding 5: the MR table is shared read-only, but a memfd handed over read-only can be
// reopened read-write through /proc/self/fd. The attacker does that to its own table and to
// the victim's (which every UD sender of the node is handed along with a ring of the
// victim's UD QP), then tries every way to change it: a writable mapping, write(2), a hole
// punched in it, a read-only mapping made writable. Each must fail; the router must still
// publish registrations in the table. Writes are of the bytes already there, so a breach
// harms nobody.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <string>

#include "adversary.h"

namespace ff::adversary {
namespace {

// The ways `f` lets its holder change the table behind it.
void TryWrites(int f, std::vector<std::string>* worked) {
  void* p = ::mmap(nullptr, kMrTableBytes, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
  if (p != MAP_FAILED) {
    worked->push_back("a writable mapping");
    ::munmap(p, kMrTableBytes);
  }
  char head[sizeof(MrEntry)];
  if (::pread(f, head, sizeof(head), 0) == static_cast<ssize_t>(sizeof(head)) &&
      ::pwrite(f, head, sizeof(head), 0) == static_cast<ssize_t>(sizeof(head)))
    worked->push_back("pwrite");
  // The last page holds the highest slots, which no test registration reaches.
  if (::fallocate(f, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, kMrTableBytes - 4096, 4096) == 0)
    worked->push_back("a punched hole");
  void* ro = ::mmap(nullptr, kMrTableBytes, PROT_READ, MAP_SHARED, f, 0);
  if (ro != MAP_FAILED) {
    if (::mprotect(ro, kMrTableBytes, PROT_READ | PROT_WRITE) == 0)
      worked->push_back("mprotect of a read-only mapping");
    ::munmap(ro, kMrTableBytes);
  }
}

// Attacks the table behind `fd`, as handed over and reopened read-write.
void AttackTable(int fd, const std::string& whose, Report& r) {
  const std::string self = "/proc/self/fd/" + std::to_string(fd);
  UniqueFd rw(::open(self.c_str(), O_RDWR | O_CLOEXEC));
  std::vector<std::string> worked;
  TryWrites(fd, &worked);
  if (rw) TryWrites(rw.get(), &worked);
  std::string got = rw ? "reopened read-write; " : "no read-write reopen; ";
  if (worked.empty()) got += "no mapping, write, hole or mprotect could change it";
  for (size_t i = 0; i < worked.size(); ++i) got += (i == 0 ? "wrote it by " : ", ") + worked[i];
  r.Check(worked.empty(), "writing " + whose + " through its descriptor and a reopen", got);
}

// The router still publishes registrations in the pod's table.
bool TablePublishes(RawPod& pod) {
  constexpr uint64_t kAddr = 0x7000;
  const uint32_t key = pod.RegisterLocal(kAddr, 4096, IBV_ACCESS_LOCAL_WRITE);
  Mapping table;
  if (key == 0 || MapSegment(pod.mr_table_fd(), kMrTableBytes, false, &table) != 0) return false;
  MrView v{};
  return ReadMrEntry(table.as<MrEntry>(), key, &v) && v.addr == kAddr && v.length == 4096;
}

}  // namespace

int MrTable(const Args& a) {
  Report r("5", "mr-table");
  auto start = OpenAgainstVictim(a, r);
  if (!start) return r.Finish();
  AttackTable(start->pod.mr_table_fd(), "its own MR table", r);
  // A UD sender of the node is handed the victim's table along with a ring of its UD QP.
  RawPod& pod = start->pod;
  const RawQp ud = pod.CreateQp(IBV_QPT_UD, kUdRingsPerQp, kUdRingBytes);
  const RawLink link = pod.Connect(ud, start->victim.ip, start->victim.ud_qpn, true);
  if (link.status == 0 && link.fds.size() >= 3) {
    AttackTable(link.fds[2].get(), "the victim's MR table (from a UD resolve)", r);
  } else {
    r.Check(true, "obtaining the victim's MR table through a UD resolve",
            ErrName(link.status) + ", " + std::to_string(link.fds.size()) + " descriptors");
  }
  r.Check(TablePublishes(pod), "registering after the attack",
          "the router still publishes registrations in the table");
  return Conclude(r, Rendezvous(a.meet));
}

}  // namespace ff::adversary
