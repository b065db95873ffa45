#include "sock.h"

#include <sched.h>
#include <time.h>

#include <cerrno>
#include <mutex>
#include <vector>

#include "bells.h"
#include "epoll.h"
#include "log.h"

namespace ff::fsocket {
namespace {

constexpr int kChunkBits = 12;
constexpr int kChunkSlots = 1 << kChunkBits;
constexpr int kMaxChunks = 256;  // descriptors below 2^20 (the kernel's default hard limit)

struct Chunk {
  std::atomic<Sock*> slots[kChunkSlots];
  std::atomic<bool> dialable[kChunkSlots];  // MayBecomeStream
};
std::atomic<Chunk*> g_chunks[kMaxChunks];
std::atomic<int> g_live[4];  // Socks per Kind

std::mutex& PoolMu() {
  static std::mutex* mu = new std::mutex;
  return *mu;
}
std::vector<Sock*>& Pool() {
  static auto* pool = new std::vector<Sock*>;
  return *pool;
}

// The chunk holding `fd`'s entries (made when `create`), or null.
Chunk* ChunkOf(int fd, bool create) {
  if (fd < 0 || (fd >> kChunkBits) >= kMaxChunks) return nullptr;
  std::atomic<Chunk*>& c = g_chunks[fd >> kChunkBits];
  Chunk* chunk = c.load(std::memory_order_acquire);
  if (chunk == nullptr && create) {
    Chunk* fresh = new Chunk{};
    if (!c.compare_exchange_strong(chunk, fresh, std::memory_order_acq_rel)) {
      delete fresh;
    } else {
      chunk = fresh;
    }
  }
  return chunk;
}

std::atomic<Sock*>* SlotOf(int fd, bool create) {
  Chunk* chunk = ChunkOf(fd, create);
  return chunk == nullptr ? nullptr : &chunk->slots[fd & (kChunkSlots - 1)];
}

// fn(chunk, index, fd) for every descriptor in [lo, hi] (hi < 0: no end) whose chunk exists.
template <typename Fn>
void ForEachIn(int lo, int hi, Fn fn) {
  if (lo < 0) lo = 0;
  const int top = kMaxChunks * kChunkSlots - 1;
  if (hi > top || hi < 0) hi = top;
  for (int c = lo >> kChunkBits; c <= (hi >> kChunkBits); ++c) {
    Chunk* chunk = g_chunks[c].load(std::memory_order_acquire);
    if (chunk == nullptr) continue;
    for (int i = 0; i < kChunkSlots; ++i) {
      const int fd = (c << kChunkBits) | i;
      if (fd >= lo && fd <= hi) fn(*chunk, i, fd);
    }
  }
}

// The last reference went: give back what the Sock held and return it to the pool.
void Recycle(Sock* s) {
  const Kind k = s->kind;
  if (k == Kind::kEpoll) {
    EpollShadowGone(s);
    s->shadow.reset();
  }
  if (k == Kind::kStream) CloseBell(*s);
  s->seg.reset();
  s->side.reset();
  s->tx = s->rx = nullptr;
  s->tx_data = s->rx_data = nullptr;
  s->locks = nullptr;
  s->kind = Kind::kFree;
  g_live[static_cast<int>(k)].fetch_sub(1, std::memory_order_relaxed);
  std::lock_guard lock(PoolMu());
  Pool().push_back(s);
}

// A reference on `s` unless it is being recycled (no reference left).
bool TryTake(Sock* s) {
  int32_t r = s->refs.load(std::memory_order_acquire);
  while (r > 0) {
    if (s->refs.compare_exchange_weak(r, r + 1, std::memory_order_acq_rel)) return true;
  }
  return false;
}

void Drop(Sock* s) {
  if (s != nullptr && s->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) Recycle(s);
}

}  // namespace

Ref& Ref::operator=(Ref&& o) noexcept {
  if (this != &o) {
    Drop(s_);
    s_ = o.s_;
    o.s_ = nullptr;
  }
  return *this;
}

Ref::~Ref() { Drop(s_); }

Ref NewSock(Kind kind) {
  Sock* s = nullptr;
  {
    std::lock_guard lock(PoolMu());
    if (!Pool().empty()) {
      s = Pool().back();
      Pool().pop_back();
    }
  }
  if (s == nullptr) s = new Sock;
  s->kind = kind;
  s->state.store(StreamState::kOpen);
  s->eof.store(false);
  s->rd_shut.store(false);
  s->wr_shut.store(false);
  s->error.store(0);
  s->dead.store(false);
  s->waiters.store(0);
  s->nonblock.store(false);
  s->bell_hung.store(false);
  s->rcv_timeout_ms.store(kTimeoutUnknown);
  s->snd_timeout_ms.store(kTimeoutUnknown);
  s->app_nodelay.store(false);
  s->peer_ip_net = 0;
  s->local_port = 0;
  s->peer_port = 0;
  s->dialed = false;
  s->look = false;
  s->exchanges.store(0);
  s->port = 0;
  s->registered_by = 0;
  s->registered_in = 0;
  g_live[static_cast<int>(kind)].fetch_add(1, std::memory_order_relaxed);
  s->refs.store(1, std::memory_order_release);
  return Ref(s);
}

Ref Share(Sock* s) {
  s->refs.fetch_add(1, std::memory_order_acq_rel);
  return Ref(s);
}

Ref Lookup(int fd) {
  std::atomic<Sock*>* slot = SlotOf(fd, false);
  if (slot == nullptr) return Ref();
  for (;;) {
    Sock* s = slot->load(std::memory_order_acquire);
    if (s == nullptr) return Ref();
    if (!TryTake(s)) continue;  // recycled under us: the slot has changed
    if (slot->load(std::memory_order_acquire) == s) return Ref(s);
    Drop(s);
  }
}

Ref Install(int fd, Sock* s) {
  std::atomic<Sock*>* slot = SlotOf(fd, true);
  if (slot == nullptr) {
    LogError("descriptor %d is beyond what TCP mode tracks: kernel TCP for it", fd);
    return Ref();
  }
  s->refs.fetch_add(1, std::memory_order_acq_rel);
  return Ref(slot->exchange(s, std::memory_order_acq_rel));
}

Ref Detach(int fd) {
  std::atomic<Sock*>* slot = SlotOf(fd, false);
  if (slot == nullptr) return Ref();
  return Ref(slot->exchange(nullptr, std::memory_order_acq_rel));
}

void SetMayBecomeStream(int fd, bool may) {
  if (Chunk* chunk = ChunkOf(fd, may))
    chunk->dialable[fd & (kChunkSlots - 1)].store(may, std::memory_order_release);
}

bool MayBecomeStream(int fd) {
  const Chunk* chunk = ChunkOf(fd, false);
  return chunk != nullptr &&
         chunk->dialable[fd & (kChunkSlots - 1)].load(std::memory_order_acquire);
}

void SettleRange(int lo, int hi) {
  ForEachIn(lo, hi, [](Chunk& chunk, int i, int) {
    chunk.dialable[i].store(false, std::memory_order_release);
  });
}

bool AnyOfKind(Kind k) { return g_live[static_cast<int>(k)].load(std::memory_order_relaxed) > 0; }

std::vector<int> SlotsIn(int lo, int hi) {
  std::vector<int> out;
  ForEachIn(lo, hi, [&out](Chunk& chunk, int i, int fd) {
    if (chunk.slots[i].load(std::memory_order_acquire) != nullptr) out.push_back(fd);
  });
  return out;
}

namespace {

void InitLocks(SideLocks* l) {
  pthread_mutexattr_t a;
  pthread_mutexattr_init(&a);
  pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(&l->send_mu, &a);
  pthread_mutex_init(&l->recv_mu, &a);
  pthread_mutex_init(&l->drain_mu, &a);
  pthread_mutexattr_destroy(&a);
}

// The first process of the pod to use the side page sets the locks up; the others wait for
// it (a setter that died half-way is replaced after a second).
void EnsureLocks(SideLocks* l) {
  if (l->init.load(std::memory_order_acquire) == 2) return;
  uint32_t fresh = 0;
  if (l->init.compare_exchange_strong(fresh, 1, std::memory_order_acq_rel)) {
    InitLocks(l);
    l->init.store(2, std::memory_order_release);
    return;
  }
  for (int i = 0; i < 10000 && l->init.load(std::memory_order_acquire) != 2; ++i) {
    timespec ts{0, 100'000};
    nanosleep(&ts, nullptr);
  }
  if (l->init.load(std::memory_order_acquire) != 2) {
    InitLocks(l);
    l->init.store(2, std::memory_order_release);
  }
}

int Lock(SideLocks* l, pthread_mutex_t* mu) {
  EnsureLocks(l);
  const int rc = pthread_mutex_lock(mu);
  if (rc == EOWNERDEAD) {
    // A process of this pod died holding it: the ring indices it had not published yet
    // were never seen, so the ring is consistent.
    pthread_mutex_consistent(mu);
    return 0;
  }
  return rc == 0 ? 0 : EIO;
}

}  // namespace

int LockSend(Sock& s) { return Lock(s.locks, &s.locks->send_mu); }
int LockRecv(Sock& s) { return Lock(s.locks, &s.locks->recv_mu); }
int LockDrain(Sock& s) { return Lock(s.locks, &s.locks->drain_mu); }
void UnlockDrain(Sock& s) { pthread_mutex_unlock(&s.locks->drain_mu); }
void UnlockSend(Sock& s) { pthread_mutex_unlock(&s.locks->send_mu); }
void UnlockRecv(Sock& s) { pthread_mutex_unlock(&s.locks->recv_mu); }

namespace {
std::atomic<bool> g_restricted{false};
}  // namespace

bool Restricted() { return g_restricted.load(std::memory_order_relaxed); }
void SetRestricted() { g_restricted.store(true); }

void SockPrepareFork() { PoolMu().lock(); }
void SockParentAfterFork() { PoolMu().unlock(); }
void SockChildAfterFork() { PoolMu().unlock(); }

}  // namespace ff::fsocket
