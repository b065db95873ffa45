// Memory registration. A registered buffer must be reachable by peers without the owner
// running, so its pages are moved into a memfd ("region") mapped over the same
// addresses (MAP_FIXED): the application keeps using the same pointers, and the router
// can hand the memfd to connected peers. Deregistration moves the pages back into private
// memory, so from the moment ibv_dereg_mr returns no peer can reach them any more.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>

#include "exports.h"

namespace ffv {
namespace {

std::mutex g_region_mu;
std::map<uintptr_t, std::unique_ptr<Region>> g_regions;  // by start address
std::unordered_map<Region*, std::vector<Mr*>> g_region_mrs;
uint32_t g_next_region = 1;

uintptr_t PageSize() {
  static const uintptr_t p = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  return p;
}

bool RangeMapped(uintptr_t start, size_t size) {
  std::vector<unsigned char> vec((size + PageSize() - 1) / PageSize());
  return ::mincore(reinterpret_cast<void*>(start), size, vec.data()) == 0;
}

// Creates a memfd with the current contents of [start, start+size) and maps it over
// that range. Other threads writing to these pages during the switch may lose writes;
// registration is not expected to race with the application's own use of the buffer.
int ShadowRange(uintptr_t start, size_t size, UniqueFd* out) {
  UniqueFd fd;
  int rc = ff::CreateSegment("ffverbs-mr", size, &fd);
  if (rc != 0) return rc;
  void* tmp = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (tmp == MAP_FAILED) return errno;
  std::memcpy(tmp, reinterpret_cast<void*>(start), size);
  void* fixed = ::mmap(reinterpret_cast<void*>(start), size, PROT_READ | PROT_WRITE,
                       MAP_SHARED | MAP_FIXED, fd.get(), 0);
  const int err = errno;
  ::munmap(tmp, size);
  if (fixed == MAP_FAILED) return err;
  *out = std::move(fd);
  return 0;
}

// Gives [start, start+size) private anonymous pages with the current contents.
void Unshadow(uintptr_t start, size_t size) {
  if (!RangeMapped(start, size)) return;  // the application unmapped it already
  void* tmp = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (tmp == MAP_FAILED) {
    LogError("cannot restore private memory after deregistration: %s", std::strerror(errno));
    return;
  }
  std::memcpy(tmp, reinterpret_cast<void*>(start), size);
  if (::mremap(tmp, size, size, MREMAP_MAYMOVE | MREMAP_FIXED, reinterpret_cast<void*>(start)) ==
      MAP_FAILED) {
    LogError("cannot restore private memory after deregistration: %s", std::strerror(errno));
    ::munmap(tmp, size);
  }
}

int MoveMr(Session* s, Mr* mr, Region* to, bool send_fd) {
  ff::proto::MoveMr m{};
  m.h.op = ff::proto::Op::kMoveMr;
  m.key = mr->mr.lkey;
  m.region_id = to->id;
  m.region_offset = reinterpret_cast<uintptr_t>(mr->mr.addr) - to->start;
  m.region_size = to->size;
  m.new_region = send_fd ? 1 : 0;
  m.release_old = 1;
  ff::proto::Response r{};
  const int fd = to->fd.get();
  return s->Call(&m, sizeof(m), send_fd ? &fd : nullptr, send_fd ? 1 : 0, &r);
}

// Finds or creates the region that will back [addr, addr+len). *fresh tells whether the
// router has not seen its memfd yet. g_region_mu held.
int AcquireRegion(Session* s, uintptr_t addr, size_t len, Region** out, bool* fresh) {
  const uintptr_t page = PageSize();
  uintptr_t lo = addr & ~(page - 1);
  uintptr_t hi = (addr + len + page - 1) & ~(page - 1);
  // Every region that overlaps, growing the range until it is stable.
  std::vector<Region*> overlap;
  for (bool grew = true; grew;) {
    grew = false;
    overlap.clear();
    for (auto& [start, r] : g_regions) {
      if (start < hi && start + r->size > lo) {
        overlap.push_back(r.get());
        if (start < lo || start + r->size > hi) {
          lo = std::min(lo, start);
          hi = std::max(hi, start + r->size);
          grew = true;
        }
      }
    }
  }
  if (overlap.size() == 1 && overlap[0]->start == lo && overlap[0]->size == hi - lo) {
    *out = overlap[0];
    *fresh = false;
    return 0;
  }
  if (!RangeMapped(lo, hi - lo)) return EFAULT;
  auto region = std::make_unique<Region>();
  region->id = g_next_region++;
  region->start = lo;
  region->size = hi - lo;
  const int rc = ShadowRange(lo, hi - lo, &region->fd);
  if (rc != 0) return rc;
  Region* fresh_region = region.get();
  *fresh = true;
  // Move the registrations of merged regions into the new one (keys do not change).
  std::vector<Mr*> moved;
  for (Region* old : overlap) {
    for (Mr* mr : g_region_mrs[old]) moved.push_back(mr);
    g_region_mrs.erase(old);
    g_regions.erase(old->start);
  }
  for (Mr* mr : moved) {
    const int err = MoveMr(s, mr, fresh_region, *fresh);
    if (err == 0) *fresh = false;
    else LogError("cannot move a registration into a merged region: %s", std::strerror(err));
    mr->region = fresh_region;
  }
  g_region_mrs[fresh_region] = std::move(moved);
  g_regions[lo] = std::move(region);
  *out = fresh_region;
  return 0;
}

}  // namespace
}  // namespace ffv

using namespace ffv;

extern "C" {

FFV_EXPORT ibv_mr* ibv_reg_mr_iova2(ibv_pd* pd, void* addr, size_t length, uint64_t iova,
                                    unsigned int access) {
  if (pd == nullptr || addr == nullptr || length == 0 || length > ff::kMaxMsgSize * 64) {
    errno = EINVAL;
    return nullptr;
  }
  if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
      !(access & IBV_ACCESS_LOCAL_WRITE)) {
    errno = EINVAL;  // as the verbs specification requires
    return nullptr;
  }
  Context* ctx = ToCtx(pd->context);
  Session* s = ctx->session;
  auto mr = std::make_unique<Mr>();
  std::lock_guard<std::mutex> g(g_region_mu);
  Region* region = nullptr;
  bool fresh = false;
  int rc = AcquireRegion(s, reinterpret_cast<uintptr_t>(addr), length, &region, &fresh);
  if (rc != 0) {
    errno = rc;
    return nullptr;
  }
  ff::proto::RegMr m{};
  m.h.op = ff::proto::Op::kRegMr;
  m.addr = iova;
  m.length = length;
  m.region_offset = reinterpret_cast<uintptr_t>(addr) - region->start;
  m.region_size = region->size;
  m.access = access;
  m.region_id = region->id;
  m.new_region = fresh ? 1 : 0;
  ff::proto::Response r{};
  const int fd = region->fd.get();
  rc = s->Call(&m, sizeof(m), fresh ? &fd : nullptr, fresh ? 1 : 0, &r);
  if (rc != 0) {
    if (g_region_mrs[region].empty()) {
      Unshadow(region->start, region->size);
      g_region_mrs.erase(region);
      g_regions.erase(region->start);
    }
    LogError("memory registration refused by the router: %s", std::strerror(rc));
    errno = rc;
    return nullptr;
  }
  mr->mr.context = pd->context;
  mr->mr.pd = pd;
  mr->mr.addr = addr;
  mr->mr.length = length;
  mr->mr.handle = r.u.reg_mr.key;
  mr->mr.lkey = r.u.reg_mr.key;
  mr->mr.rkey = r.u.reg_mr.key;
  mr->iova = iova;
  mr->access = static_cast<int>(access);
  mr->region = region;
  g_region_mrs[region].push_back(mr.get());
  {
    std::lock_guard<SpinLock> l(ctx->lock);
    const uint32_t slot = ff::MrSlotOfKey(mr->mr.lkey);
    if (ctx->mrs_by_slot.size() <= slot) ctx->mrs_by_slot.resize(slot + 1, nullptr);
    ctx->mrs_by_slot[slot] = mr.get();
  }
  return &mr.release()->mr;
}

FFV_EXPORT ibv_mr* ibv_reg_mr(ibv_pd* pd, void* addr, size_t length, int access) {
  return ibv_reg_mr_iova2(pd, addr, length, reinterpret_cast<uintptr_t>(addr),
                          static_cast<unsigned int>(access));
}

FFV_EXPORT ibv_mr* ibv_reg_mr_iova(ibv_pd* pd, void* addr, size_t length, uint64_t iova,
                                   int access) {
  return ibv_reg_mr_iova2(pd, addr, length, iova, static_cast<unsigned int>(access));
}

FFV_EXPORT int ibv_dereg_mr(ibv_mr* ibmr) {
  if (ibmr == nullptr) return EINVAL;
  Mr* mr = ToMr(ibmr);
  Context* ctx = ToCtx(ibmr->context);
  {
    std::lock_guard<SpinLock> l(ctx->lock);
    const uint32_t slot = ff::MrSlotOfKey(ibmr->lkey);
    if (slot < ctx->mrs_by_slot.size() && ctx->mrs_by_slot[slot] == mr)
      ctx->mrs_by_slot[slot] = nullptr;
    if (ctx->last_mr == mr) ctx->last_mr = nullptr;
  }
  std::lock_guard<std::mutex> g(g_region_mu);
  Region* region = mr->region;
  auto& list = g_region_mrs[region];
  list.erase(std::remove(list.begin(), list.end(), mr), list.end());
  ff::proto::DeregMr m{};
  m.h.op = ff::proto::Op::kDeregMr;
  m.key = ibmr->lkey;
  m.release_region = list.empty() ? 1 : 0;
  ff::proto::Response r{};
  const int rc = ctx->session->Call(&m, sizeof(m), nullptr, 0, &r);
  if (rc != 0 && rc != ENOTCONN) LogError("router refused deregistration: %s", std::strerror(rc));
  // Revoke: after this no peer mapping reaches the application's pages.
  if (list.empty()) {
    Unshadow(region->start, region->size);
    g_region_mrs.erase(region);
    g_regions.erase(region->start);
  }
  delete mr;
  return 0;
}

FFV_EXPORT ibv_mr* ibv_reg_dmabuf_mr(ibv_pd*, uint64_t, size_t, uint64_t, int, int) {
  errno = EOPNOTSUPP;
  return nullptr;
}

FFV_EXPORT int ibv_rereg_mr(ibv_mr*, int, ibv_pd*, void*, size_t, int) {
  errno = EOPNOTSUPP;
  return IBV_REREG_MR_ERR_INPUT;
}

}  // extern "C"
