// Producer and consumer ends of the SPSC record ring in shm_layout.h.
//
// Each end keeps its own index in private memory and a cached copy of the other end's
// index, so the steady state touches the shared header only when the cached view runs
// out (classic SPSC batching). Neither end trusts the other: indices and record headers
// read from shared memory are validated, and a violation reports the ring as corrupt.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>

#include "freeflow/shm_layout.h"

namespace ff {

enum class RingStatus { kOk, kFull, kEmpty, kCorrupt };

// What both ends keep of a ring: its shared header, its data and their size.
class RingEnd {
 public:
  bool attached() const { return header_ != nullptr; }
  uint32_t size() const { return size_; }
  // False when the indices found in shared memory at Attach could not be continued from
  // (misaligned, or further apart than the ring): every operation then reports kCorrupt.
  bool sane() const { return sane_; }

 protected:
  // Indices are byte counts that only grow, always by whole cache lines, and never more
  // than a ring apart. Whatever the other end wrote, an end that starts from these stays
  // inside the ring.
  static bool ValidIndices(uint64_t head, uint64_t tail, uint32_t bytes) {
    return (head & (kCacheLine - 1)) == 0 && (tail & (kCacheLine - 1)) == 0 && head <= tail &&
           tail - head <= bytes;
  }
  void AttachTo(RingHeader* header, uint32_t bytes) {
    header_ = header;
    data_ = RingData(header);
    size_ = bytes;
  }
  RingHeader* header_ = nullptr;
  char* data_ = nullptr;
  uint32_t size_ = 0;  // power of two
  bool sane_ = true;
};

class RingProducer : public RingEnd {
 public:
  // Attaches to a ring of `bytes` (power of two) and continues from its published tail.
  void Attach(RingHeader* header, uint32_t bytes) {
    AttachTo(header, bytes);
    tail_ = header->tail.load(std::memory_order_relaxed);
    head_cache_ = header->head.load(std::memory_order_acquire);
    sane_ = ValidIndices(head_cache_, tail_, bytes);
  }

  // Finds room for one record of `total` bytes (a RecordBytes() value). On kOk, *out
  // points where the record goes; fill it and call Commit(total).
  RingStatus Reserve(uint32_t total, char** out) {
    if (!sane_) return RingStatus::kCorrupt;
    uint64_t pos = tail_ & (size_ - 1);
    uint64_t contiguous = size_ - pos;
    uint64_t need = contiguous < total ? contiguous + total : total;
    if (size_ - (tail_ - head_cache_) < need) {
      const uint64_t head = header_->head.load(std::memory_order_acquire);
      if (!ValidIndices(head, tail_, size_)) return RingStatus::kCorrupt;
      head_cache_ = head;
      if (size_ - (tail_ - head_cache_) < need) return RingStatus::kFull;
    }
    if (contiguous < total) {
      auto* pad = reinterpret_cast<RecordHeader*>(data_ + pos);
      pad->total = static_cast<uint32_t>(contiguous);
      pad->kind = kRecPad;
      pad->flags = 0;
      pad->frag_len = 0;
      tail_ += contiguous;
      pos = 0;
    }
    *out = data_ + pos;
    return RingStatus::kOk;
  }
  void Commit(uint32_t total) { tail_ += total; }
  // Makes every committed record visible to the consumer.
  void Publish() { header_->tail.store(tail_, std::memory_order_release); }
  // Where the next record goes: after Publish(), the end of every record published so far.
  uint64_t position() const { return tail_; }
  // True once the consumer released everything before `pos` (a position() value).
  bool ReleasedUpTo(uint64_t pos) const {
    return header_->head.load(std::memory_order_acquire) >= pos;
  }

 private:
  uint64_t tail_ = 0;        // private: next byte to write
  uint64_t head_cache_ = 0;  // last head seen from the consumer
};

class RingConsumer : public RingEnd {
 public:
  // Attaches to a ring of `bytes` (power of two) and continues from its released head.
  void Attach(RingHeader* header, uint32_t bytes) {
    AttachTo(header, bytes);
    head_ = header->head.load(std::memory_order_relaxed);
    tail_cache_ = head_;
    sane_ = ValidIndices(head_, head_, bytes);
  }

  // Copies the next record's header into *hdr and returns a pointer to its payload.
  // Padding records are skipped. kEmpty when nothing is published.
  RingStatus Peek(RecordHeader* hdr, const char** payload) {
    if (!sane_) return RingStatus::kCorrupt;
    for (int skipped = 0; skipped < 2; ++skipped) {
      if (head_ == tail_cache_) {
        const uint64_t tail = header_->tail.load(std::memory_order_acquire);
        if (!ValidIndices(head_, tail, size_)) return RingStatus::kCorrupt;
        tail_cache_ = tail;
        if (head_ == tail_cache_) return RingStatus::kEmpty;
      }
      const uint64_t pos = head_ & (size_ - 1);
      std::memcpy(hdr, data_ + pos, sizeof(*hdr));
      const uint64_t avail = tail_cache_ - head_;
      if (hdr->total < sizeof(RecordHeader) || (hdr->total & (kCacheLine - 1)) != 0 ||
          hdr->total > size_ - pos || hdr->total > avail) {
        return RingStatus::kCorrupt;
      }
      if (hdr->kind == kRecPad) {
        head_ += hdr->total;
        continue;
      }
      if (hdr->frag_len > hdr->total - sizeof(RecordHeader)) return RingStatus::kCorrupt;
      *payload = data_ + pos + sizeof(RecordHeader);
      return RingStatus::kOk;
    }
    return RingStatus::kEmpty;
  }
  void Consume(const RecordHeader& hdr) { head_ += hdr.total; }
  // Returns the consumed space to the producer.
  void Release() { header_->head.store(head_, std::memory_order_release); }
  // True when records were consumed since the last Release().
  bool HasUnreleased() const { return header_->head.load(std::memory_order_relaxed) != head_; }

 private:
  uint64_t head_ = 0;        // private: next byte to read
  uint64_t tail_cache_ = 0;  // last tail seen from the producer
};

}  // namespace ff
