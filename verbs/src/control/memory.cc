// Memory registration. A buffer registered with remote access must be reachable by peers
// without the owner running, so its pages are moved into a memfd ("region") mapped over the
// same addresses (MAP_FIXED): the application keeps using the same pointers, and the router
// can hand the memfd to connected peers. Deregistration moves the pages back into private
// memory, so from the moment ibv_dereg_mr returns no peer can reach them any more.
//
// A registration without remote access has no region: its memory never leaves the process.
// One with IBV_ACCESS_MW_BIND has one even without remote flags (windows bound over it
// later grant remote access), writable when it has local write (ff::RegistrationWritable).
// A region whose registrations grant remote reads only is sealed read-only (SealReadOnly)
// once the application's own mapping is in place, so what a peer is given can only be
// read, even reopened. When a registration that grants writes joins such a region, the
// pages move to a fresh, writable region; when the last one leaves, they move to a fresh,
// sealed one (peers that mapped the old memfd keep memory that no longer backs ours).
//
// Regions are process-wide, by address (pages belong to the process, not to a context);
// each remembers the session whose router has its memfd. Overlapping registrations share
// or merge regions of one session; a registration overlapping a region of another session
// is refused (EINVAL), since merging would move a registration between routers.
//
// The address-space changes below go straight to the kernel, never through libc's mmap,
// munmap or mremap: programs hook those. UCX's libucm replaces them (in libc itself or in
// every loaded object's relocations) to watch for unmapped memory; its mremap takes four
// arguments and dropped the fifth, MREMAP_FIXED's target, so Unshadow's copy landed at an
// arbitrary address (EINVAL, or address 0 when root). Freeflow's remaps keep every page
// mapped with the same contents, so there is nothing for such a hook to see either: UCM's
// registration cache would take the MAP_FIXED of a registration for an unmap and drop
// registrations that stay valid.
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "base/exports.h"
#include "control/page_switch.h"
#include "direct/direct.h"
#include "freeflow/target_ops.h"
#include "session/session.h"

namespace ff::verbs {
namespace {

std::mutex g_region_mu;  // guards everything below; taken before any context lock
std::map<uintptr_t, std::unique_ptr<Region>> g_regions;  // by start address
std::unordered_map<Region*, std::vector<Mr*>> g_region_mrs;
uint32_t g_next_region = 1;

uintptr_t PageSize() {
  static const uintptr_t p = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  return p;
}

// x86-64's mmap system call (SYS_mmap takes the six arguments there).
// What every registration must satisfy: at most kMaxMrSize bytes, and local write whenever
// remote write or atomics are granted (the verbs specification).
bool ValidRegistration(size_t length, unsigned access) {
  return length <= ff::kMaxMrSize &&
         !((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
           !(access & IBV_ACCESS_LOCAL_WRITE));
}

void* RawMmap(void* addr, size_t len, int prot, int flags, int fd, off_t offset) {
  return reinterpret_cast<void*>(::syscall(SYS_mmap, addr, len, prot, flags, fd, offset));
}

void RawMunmap(void* addr, size_t len) { ::syscall(SYS_munmap, addr, len); }

void* RawMremapFixed(void* from, size_t len, void* to) {
  return reinterpret_cast<void*>(
      ::syscall(SYS_mremap, from, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, to));
}

bool RangeMapped(uintptr_t start, size_t size) {
  std::vector<unsigned char> vec((size + PageSize() - 1) / PageSize());
  return ::mincore(reinterpret_cast<void*>(start), size, vec.data()) == 0;
}

// Creates a memfd with the current contents of [start, start+size) and maps it over that
// range; other threads' writes to those pages meanwhile are held, not lost (page_switch.h).
int ShadowRange(uintptr_t start, size_t size, UniqueFd* out) {
  UniqueFd fd;
  int rc = ff::CreateSegment("ffverbs-mr", size, &fd);
  if (rc != 0) return rc;
  void* tmp = RawMmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (tmp == MAP_FAILED) return errno;
  void* fixed = MAP_FAILED;
  int err = 0;
  {
    PageSwitch move(start, size);
    std::memcpy(tmp, reinterpret_cast<void*>(start), size);
    fixed = RawMmap(reinterpret_cast<void*>(start), size, PROT_READ | PROT_WRITE,
                    MAP_SHARED | MAP_FIXED, fd.get(), 0);
    err = errno;
    if (fixed != MAP_FAILED) move.Mapped();
  }
  RawMunmap(tmp, size);
  if (fixed == MAP_FAILED) return err;
  *out = std::move(fd);
  return 0;
}

// Gives [start, start+size) private anonymous pages with the current contents.
void Unshadow(uintptr_t start, size_t size) {
  if (!RangeMapped(start, size)) return;  // the application unmapped it already
  void* tmp = RawMmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (tmp == MAP_FAILED) {
    LogError("cannot restore private memory after deregistration: %s", std::strerror(errno));
    return;
  }
  PageSwitch move(start, size);
  std::memcpy(tmp, reinterpret_cast<void*>(start), size);
  if (RawMremapFixed(tmp, size, reinterpret_cast<void*>(start)) == MAP_FAILED) {
    LogError("cannot restore private memory after deregistration: %s", std::strerror(errno));
    RawMunmap(tmp, size);
    return;
  }
  move.Mapped();
}

// Region `r` is no longer the process's: peers on other nodes reach it no more.
void Forget(const Region* r) { ForgetDirectRegion(r->session, r->id); }

void DropRegion(Region* region) {
  Forget(region);
  Unshadow(region->start, region->size);
  g_region_mrs.erase(region);
  g_regions.erase(region->start);
}

int MoveMr(Mr* mr, Region* to, bool send_fd) {
  ff::proto::MoveMr m{};
  m.key = mr->mr.lkey;
  m.region_id = to->id;
  m.region_offset = reinterpret_cast<uintptr_t>(mr->mr.addr) - to->start;
  m.region_size = to->size;
  m.new_region = send_fd ? 1 : 0;
  m.release = 1;
  ff::proto::Response r{};
  const int fd = to->fd.get();
  return to->session->Call(&m, sizeof(m), send_fd ? &fd : nullptr, send_fd ? 1 : 0, &r);
}

// Every region overlapping [*lo, *hi), widening the range until it is stable.
std::vector<Region*> Overlapping(uintptr_t* lo, uintptr_t* hi) {
  std::vector<Region*> overlap;
  for (bool grew = true; grew;) {
    grew = false;
    overlap.clear();
    for (auto& [start, r] : g_regions) {
      if (start >= *hi || start + r->size <= *lo) continue;
      overlap.push_back(r.get());
      if (start < *lo || start + r->size > *hi) {
        *lo = std::min(*lo, start);
        *hi = std::max(*hi, start + r->size);
        grew = true;
      }
    }
  }
  return overlap;
}

// Moves the registrations of merged regions into `to`, the first move bringing its memfd.
// *fresh stays true while the router has not seen that memfd.
void MergeInto(Region* to, const std::vector<Region*>& merged, bool* fresh) {
  std::vector<Mr*> moved;
  for (Region* old : merged) {
    for (Mr* mr : g_region_mrs[old]) moved.push_back(mr);
    g_region_mrs.erase(old);
    Forget(old);
    g_regions.erase(old->start);
  }
  for (Mr* mr : moved) {
    const int err = MoveMr(mr, to, *fresh);
    if (err == 0) {
      *fresh = false;
    } else {
      LogError("cannot move a registration into a merged region: %s", std::strerror(err));
    }
    mr->region = to;
  }
  g_region_mrs[to] = std::move(moved);
}

bool AnyGrantsWrites(const std::vector<Mr*>& mrs) {
  return std::any_of(mrs.begin(), mrs.end(),
                     [](const Mr* mr) { return ff::RegistrationWritable(mr->access); });
}

// A new region of session `s` over [lo, hi), the pages moved into it; sealed when
// `read_only`. Not yet in g_regions.
int NewRegion(Session* s, uintptr_t lo, uintptr_t hi, bool read_only,
              std::unique_ptr<Region>* out) {
  auto region = std::make_unique<Region>();
  region->id = g_next_region++;
  region->start = lo;
  region->size = hi - lo;
  region->session = s;
  region->read_only = read_only;
  if (const int rc = ShadowRange(lo, hi - lo, &region->fd)) return rc;
  // After the MAP_FIXED mapping: ours stays writable, every later one is read-only.
  if (read_only) {
    if (const int rc = ff::SealReadOnly(region->fd.get())) return rc;
  }
  // Every region made here joins g_regions (its callers put it there), and leaves it
  // through Forget().
  NoteDirectRegion(s, region->id, region->fd.get(), region->size, !read_only);
  *out = std::move(region);
  return 0;
}

// Finds or creates the region of session `s` that will back [addr, addr+len) for a
// registration that grants remote writes when `writes`. *fresh tells whether the router
// has not seen its memfd yet. g_region_mu held.
int AcquireRegion(Session* s, uintptr_t addr, size_t len, bool writes, Region** out, bool* fresh) {
  const uintptr_t page = PageSize();
  uintptr_t lo = addr & ~(page - 1);
  uintptr_t hi = (addr + len + page - 1) & ~(page - 1);
  const std::vector<Region*> overlap = Overlapping(&lo, &hi);
  for (const Region* r : overlap) {
    if (r->session == s) continue;
    LogError(
        "cannot register %zu bytes at %p through the router at %s: the pages are "
        "registered through another router connection (%s) of this process",
        len, reinterpret_cast<void*>(addr), s->name.c_str(), r->session->name.c_str());
    return EINVAL;
  }
  if (overlap.size() == 1 && overlap[0]->start == lo && overlap[0]->size == hi - lo &&
      !(writes && overlap[0]->read_only)) {
    *out = overlap[0];
    *fresh = false;
    return 0;
  }
  if (!RangeMapped(lo, hi - lo)) return EFAULT;
  bool read_only = !writes;
  for (Region* old : overlap) read_only = read_only && !AnyGrantsWrites(g_region_mrs[old]);
  std::unique_ptr<Region> region;
  if (const int rc = NewRegion(s, lo, hi, read_only, &region)) return rc;
  *fresh = true;
  MergeInto(region.get(), overlap, fresh);
  *out = region.get();
  g_regions[lo] = std::move(region);
  return 0;
}

// The region's last registration that granted writes left: move its pages to a sealed one.
void Reseal(Region* region) {
  const std::vector<Mr*>& mrs = g_region_mrs[region];
  if (region->read_only || mrs.empty() || AnyGrantsWrites(mrs)) return;
  std::unique_ptr<Region> sealed;
  const uintptr_t lo = region->start;
  if (const int rc = NewRegion(region->session, lo, lo + region->size, true, &sealed)) {
    LogError("cannot seal a region that now grants reads only: %s", std::strerror(rc));
    return;
  }
  bool fresh = true;
  MergeInto(sealed.get(), {region}, &fresh);
  g_regions[lo] = std::move(sealed);
}

// Registers with the router, in protection domain `pd`; `region` is nullptr for a
// registration without remote access.
int Register(Session* s, const ibv_pd* pd, uintptr_t addr, size_t length, uint64_t iova,
             unsigned access, Region* region, bool fresh, uint32_t* key) {
  ff::proto::RegMr m{};
  m.addr = iova;
  m.length = length;
  m.access = access;
  m.pd = PdId(pd);
  if (region != nullptr) {
    m.region_offset = addr - region->start;
    m.region_size = region->size;
    m.region_id = region->id;
    m.new_region = fresh ? 1 : 0;
  }
  ff::proto::Response r{};
  const int fd = region != nullptr ? region->fd.get() : -1;
  const int rc = s->Call(&m, sizeof(m), fresh ? &fd : nullptr, fresh ? 1 : 0, &r);
  if (rc != 0) {
    LogError("memory registration refused by the router: %s", std::strerror(rc));
    return rc;
  }
  *key = r.u.reg_mr.key;
  return 0;
}

int RegMr(ibv_pd* pd, void* addr, size_t length, uint64_t iova, unsigned access, Mr** out) {
  Context* ctx = ToCtx(pd->context);
  auto mr = std::make_unique<Mr>();
  const auto start = reinterpret_cast<uintptr_t>(addr);
  std::lock_guard<std::mutex> g(g_region_mu);
  Region* region = nullptr;
  bool fresh = false;
  if (ff::RegistrationReachable(access)) {
    const int rc = AcquireRegion(ctx->session, start, length, ff::RegistrationWritable(access),
                                 &region, &fresh);
    if (rc != 0) return rc;
  }
  uint32_t key = 0;
  if (const int rc = Register(ctx->session, pd, start, length, iova, access, region, fresh, &key)) {
    if (region != nullptr && g_region_mrs[region].empty()) DropRegion(region);
    return rc;
  }
  mr->mr.context = pd->context;
  mr->mr.pd = pd;
  mr->mr.addr = addr;
  mr->mr.length = length;
  mr->mr.handle = key;
  mr->mr.lkey = key;
  mr->mr.rkey = key;
  mr->iova = iova;
  mr->access = static_cast<int>(access);
  mr->region = region;
  if (region != nullptr) g_region_mrs[region].push_back(mr.get());
  std::lock_guard<AdaptiveLock> l(ctx->lock);
  const uint32_t slot = ff::MrSlotOfKey(key);
  if (ctx->mrs_by_slot.size() <= slot) ctx->mrs_by_slot.resize(slot + 1, nullptr);
  ctx->mrs_by_slot[slot] = mr.get();
  *out = mr.release();
  return 0;
}

int DeregMr(Mr* mr) {
  Context* ctx = ToCtx(mr->mr.context);
  {
    std::lock_guard<AdaptiveLock> l(ctx->lock);
    if (mr->windows > 0) return EBUSY;  // memory windows are bound to it (as on mlx5)
    const uint32_t slot = ff::MrSlotOfKey(mr->mr.lkey);
    if (slot < ctx->mrs_by_slot.size() && ctx->mrs_by_slot[slot] == mr)
      ctx->mrs_by_slot[slot] = nullptr;
    if (ctx->last_mr == mr) ctx->last_mr = nullptr;
  }
  std::lock_guard<std::mutex> g(g_region_mu);
  Region* region = mr->region;
  bool last = false;
  if (region != nullptr) {
    auto& list = g_region_mrs[region];
    list.erase(std::remove(list.begin(), list.end(), mr), list.end());
    last = list.empty();
  }
  ff::proto::DeregMr m{};
  m.key = mr->mr.lkey;
  m.release = last ? 1 : 0;
  Session* s = region != nullptr ? region->session : ctx->session;
  const int rc = s->SimpleCall(&m, sizeof(m));
  if (rc != 0 && rc != ENOTCONN) LogError("router refused deregistration: %s", std::strerror(rc));
  // Revoke: after this no peer mapping reaches the application's pages (or, when reads
  // remain, none that can write them).
  if (last) {
    DropRegion(region);
  } else if (region != nullptr) {
    Reseal(region);
  }
  delete mr;
  return 0;
}

// Points the bookkeeping of registration `from` (its region's list, the lkey lookup) at `to`.
void Repoint(Mr* from, Mr* to) {
  Context* ctx = ToCtx(from->mr.context);
  {
    std::lock_guard<std::mutex> g(g_region_mu);
    if (from->region != nullptr) {
      auto& list = g_region_mrs[from->region];
      std::replace(list.begin(), list.end(), from, to);
    }
  }
  std::lock_guard<AdaptiveLock> l(ctx->lock);
  const uint32_t slot = ff::MrSlotOfKey(from->mr.lkey);
  if (slot < ctx->mrs_by_slot.size() && ctx->mrs_by_slot[slot] == from) ctx->mrs_by_slot[slot] = to;
  ctx->last_mr = nullptr;
}

// ibv_rereg_mr: a new registration with what `flags` change, then the old one deregistered,
// both behind the application's handle. The handle keeps its address; its keys are new (as
// mlx5 gives), and the old keys name nothing any more, so peers still using them fail.
int ReregMr(Mr* mr, int flags, ibv_pd* pd, void* addr, size_t length, unsigned access) {
  if (flags & IBV_REREG_MR_CHANGE_PD) {
    if (pd == nullptr || pd->context != mr->mr.context) return EINVAL;
  } else {
    pd = mr->mr.pd;
  }
  uint64_t iova = mr->iova;
  if (flags & IBV_REREG_MR_CHANGE_TRANSLATION) {
    iova = reinterpret_cast<uintptr_t>(addr);
  } else {
    addr = mr->mr.addr;
    length = mr->mr.length;
  }
  if (!(flags & IBV_REREG_MR_CHANGE_ACCESS)) access = static_cast<unsigned>(mr->access);
  if (!ValidRegistration(length, access)) return EINVAL;
  {
    std::lock_guard<AdaptiveLock> l(ToCtx(mr->mr.context)->lock);
    if (mr->windows > 0) return EBUSY;  // memory windows are bound to it
  }
  Mr* fresh = nullptr;
  if (const int rc = RegMr(pd, addr, length, iova, access, &fresh)) return rc;
  auto* old = new Mr(*mr);
  Repoint(mr, old);
  DeregMr(old);  // deletes it
  *mr = *fresh;
  Repoint(fresh, mr);
  delete fresh;
  return 0;
}

}  // namespace

void LockRegions() { g_region_mu.lock(); }
void UnlockRegions() { g_region_mu.unlock(); }

// After fork, the child shares the parent's regions (MAP_SHARED memfds): its writes would
// land in memory that peers and the router reach. Each becomes a private copy-on-write view
// of its memfd in the child (a copy, if that mapping fails), as a kernel that breaks COW on
// pinned pages gives the child of a real RDMA process; then the child forgets them.
void PrivatizeRegionsInChild() {
  for (auto& [start, region] : g_regions) {
    void* p = RawMmap(reinterpret_cast<void*>(start), region->size, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_FIXED, region->fd.get(), 0);
    if (p == MAP_FAILED) Unshadow(start, region->size);
  }
  g_region_mrs.clear();
  g_regions.clear();
}

}  // namespace ff::verbs

using namespace ff::verbs;

extern "C" {

FFV_EXPORT ibv_mr* ibv_reg_mr_iova2(ibv_pd* pd, void* addr, size_t length, uint64_t iova,
                                    unsigned int access) {
  int rc = 0;
  if (pd == nullptr || addr == nullptr || length == 0 || !ValidRegistration(length, access))
    rc = EINVAL;
  Mr* mr = nullptr;
  if (rc == 0) rc = Guarded([&] { return RegMr(pd, addr, length, iova, access, &mr); });
  return ObjectOrNull(rc, rc == 0 ? &mr->mr : nullptr);
}

FFV_EXPORT ibv_mr* ibv_reg_mr(ibv_pd* pd, void* addr, size_t length, int access) {
  return ibv_reg_mr_iova2(pd, addr, length, reinterpret_cast<uintptr_t>(addr),
                          static_cast<unsigned int>(access));
}

FFV_EXPORT ibv_mr* ibv_reg_mr_iova(ibv_pd* pd, void* addr, size_t length, uint64_t iova,
                                   int access) {
  return ibv_reg_mr_iova2(pd, addr, length, iova, static_cast<unsigned int>(access));
}

FFV_EXPORT int ibv_dereg_mr(ibv_mr* mr) {
  if (mr == nullptr) return EINVAL;
  return Guarded([&] { return DeregMr(ToMr(mr)); });
}

FFV_EXPORT ibv_mr* ibv_reg_dmabuf_mr(ibv_pd*, uint64_t, size_t, uint64_t, int, int) {
  return ObjectOrNull<ibv_mr>(EOPNOTSUPP, nullptr);
}

// Input errors as libibverbs checks them (the old registration stays valid either way: the
// new one is made before the old one goes).
FFV_EXPORT int ibv_rereg_mr(ibv_mr* mr, int flags, ibv_pd* pd, void* addr, size_t length,
                            int access) {
  int rc = 0;
  if (mr == nullptr || flags == 0 || (flags & ~IBV_REREG_MR_FLAGS_SUPPORTED) ||
      ((flags & IBV_REREG_MR_CHANGE_TRANSLATION) && (addr == nullptr || length == 0)) ||
      (access != 0 && !(flags & IBV_REREG_MR_CHANGE_ACCESS)))
    rc = EINVAL;
  if (rc == 0) {
    rc = Guarded(
        [&] { return ReregMr(ToMr(mr), flags, pd, addr, length, static_cast<unsigned>(access)); });
  }
  if (rc == 0) return 0;
  errno = rc;
  return IBV_REREG_MR_ERR_INPUT;
}

}  // extern "C"
