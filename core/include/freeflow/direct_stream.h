// One end of a direct connection as a stream of sealed frames (direct_wire.h): frames put
// are sealed into a send buffer and written without blocking; frames received are read in
// bulk, opened in place and handed out whole. Small frames put between two writes are sealed
// together as one batch when the buffer is written (one seal and one open for a message and
// the answers that go with it, instead of one each), once the peer said it takes batches
// (direct::kTakesBatches); the receiver hands them out one by one as if they had come alone.
// A frame that does not open, a head that breaks the wire's rules, or the peer closing makes
// the stream dead for good: the connection ends, and every channel on it with it. Not
// thread-safe, except that one thread may send (PutFrame, Flush) while another receives
// (Receive): the two halves share nothing but the descriptor, whether the stream died and
// whether the peer takes batches. Its owner locks each half.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "freeflow/fd.h"
#include "freeflow/frame_seal.h"
#include "freeflow/protocol/direct_wire.h"

namespace ff {

// The dialler's first frame (direct::Hello), whole, as it goes on the wire: sealed with the
// connection's secret as frame 0 of the dialler's direction. The acceptor's router opens it
// before it hands the connection over (DirectListeners); the dialler's stream then starts at
// frame 1 (Setup::first_tx). false when the cipher fails.
bool SealHello(const uint8_t (&secret)[kDirectSecretBytes], SealMode mode,
               const direct::Hello& hello, char (&frame)[direct::kHelloFrameBytes]);
// Opens such a frame: false unless its head is a hello's and its tag opens with `secret`;
// *hello is then what the dialler sealed (its fields are the caller's to check).
bool OpenHello(const uint8_t (&secret)[kDirectSecretBytes], SealMode mode,
               const char (&frame)[direct::kHelloFrameBytes], direct::Hello* hello);

class DirectStream {
 public:
  struct Setup {
    const uint8_t (*secret)[kDirectSecretBytes] = nullptr;
    DirectRole role = DirectRole::kDialler;
    SealMode mode = SealMode::kEncrypt;
    uint64_t first_rx = 0;  // frames of the peer already opened by someone else (a router)
    uint64_t first_tx = 0;  // frames of ours already sent (the dialler's hello)
  };
  // `fd`: a connected TCP socket; made non-blocking here. false from Init when the cipher
  // cannot be set up.
  explicit DirectStream(UniqueFd fd) : fd_(std::move(fd)) {}
  bool Init(const Setup& setup);

  enum class Put { kOk, kFull, kDead };
  // Requests wait for room; answers (responses, credits) get kAnswerReserve bytes more, so
  // that a receiver whose peer is slow to read never stops reading for want of room for the
  // small answers it owes: both ends doing so would wait for each other.
  enum class Priority { kRequest, kAnswer };
  static constexpr size_t kAnswerReserve = 4u << 20;
  // Seals one frame of `type` for `chan` with the `n` pieces of `body` (at most
  // direct::kMaxBody bytes in all) into the send buffer; a frame that may join a batch
  // (direct::BatchJoins, at most kBatchFrameMax bytes of body) is copied into the open batch
  // instead, sealed with it by Flush or by the next frame that cannot join it. kFull: the
  // buffer holds the limit's bytes not yet written (try again after Flush made room).
  Put PutFrame(direct::Type type, uint32_t chan, uint16_t flags, const iovec* body, int n,
               Priority priority = Priority::kRequest);
  // Seals the open batch, then writes what the socket takes. false once the stream is dead.
  bool Flush();
  size_t unsent() const { return out_len_ - out_sent_; }
  // Whether a frame of `bytes` on the wire would be taken now (PutFrame would not say kFull).
  bool HasRoom(size_t bytes) const { return unsent() == 0 || unsent() + bytes <= send_limit_; }

  // Reads what the socket holds (at most one buffer) and calls on_frame(const direct::Head&,
  // char* body) for each whole frame, opened; a false return stops there (the frame stays
  // for the next Receive). Returns the number of frames handed out, -1 once dead.
  template <typename OnFrame>
  int Receive(OnFrame&& on_frame);

  // Whether a frame of the peer said that it takes batches (set by the receiving half, read
  // by the sending half).
  bool peer_takes_batches() const { return peer_batches_.load(std::memory_order_relaxed); }

  // Whether the last receive took less than it had room for: the socket held no more then,
  // and another receive now would most likely find nothing (a system call saved per serve).
  bool drained() const { return drained_; }

  bool dead() const { return dead_.load(std::memory_order_acquire); }
  // Dead because the peer broke the wire's rules (a frame that did not open, a head the wire
  // does not allow), not because the connection closed or failed.
  bool violated() const { return violated_.load(std::memory_order_acquire); }
  const char* why_dead() const {
    const char* why = why_.load(std::memory_order_acquire);
    return why != nullptr ? why : "";
  }
  int fd() const { return fd_.get(); }
  // How many unsent bytes PutFrame lets pile up (1 MiB unless set); after Init, at most the
  // limit Init sized the buffer for.
  void set_send_limit(size_t bytes);
  // The most one frame takes on the wire.
  static constexpr size_t kFrameMax = sizeof(direct::Head) + direct::kMaxBody + kSealTagBytes;
  // Frames of at most this much body join a batch: those whose seal costs mostly its set-up
  // (the cipher's small-body implementation takes them), so that a batch saves most of it.
  static constexpr size_t kBatchFrameMax = FrameCipher::kSmallBody;
  // A batch is sealed once its body would grow past this (a burst of small frames is sealed
  // in pieces of this size, by the cipher's throughput implementation).
  static constexpr size_t kBatchBodyMax = 16 * 1024;

 private:
  // Room for `bytes` more at out_len_ (the unsent bytes move to the front, or the buffer
  // grows); false when the caller must wait (kFull). `priority` as PutFrame's.
  bool Reserve(size_t bytes, Priority priority);
  // Writes head `h` at `p` in out_, seals the `n` pieces of `body` (h.len bytes; in place
  // when they are already at p + sizeof(h)) behind it and the tag after them; out_len_ then
  // ends after the tag. false when the cipher failed (the stream died).
  bool SealAt(char* p, const direct::Head& h, const iovec* body, int n);
  // Seals the open batch where it stands (a batch of one frame as that frame alone). false
  // when the cipher failed (the stream died).
  bool CloseBatch();
  bool ReadSome();
  // The first whole frame at in_off_, opened (once: a frame handed out and left for later
  // is not opened again): nullptr when none is whole yet or the stream died (why_ says).
  char* NextFrame(direct::Head* head);
  void Die(const char* why, bool violation = false);
  // Past the frame handed out at in_off_ (and past its batch's tag after a batch's last).
  void Advance(const direct::Head& h);

  UniqueFd fd_;
  FrameCipher tx_, rx_;
  // Buffers of raw bytes, never value-initialised (a 32 KiB frame is not cleared first).
  std::unique_ptr<char[]> out_;
  size_t out_cap_ = 0, out_len_ = 0, out_sent_ = 0;
  size_t send_limit_ = 1u << 20;
  static constexpr size_t kNoBatch = SIZE_MAX;
  size_t batch_at_ = kNoBatch;  // where the open batch's head goes in out_, its frames after
  std::unique_ptr<char[]> in_;
  size_t in_cap_ = 0;
  size_t in_off_ = 0, in_have_ = 0;  // unread bytes are in_[in_off_, in_have_)
  bool opened_ = false;              // the frame at in_off_ was opened already
  size_t batch_left_ = 0;            // an opened batch's body bytes from in_off_ (its tag after)
  bool drained_ = false;             // the last receive was short (drained())
  std::atomic<bool> peer_batches_{false};
  std::atomic<bool> dead_{false};
  std::atomic<bool> violated_{false};
  std::atomic<const char*> why_{nullptr};
};

template <typename OnFrame>
int DirectStream::Receive(OnFrame&& on_frame) {
  if (dead_) return -1;
  int frames = 0;
  bool read = false;
  for (;;) {
    direct::Head h;
    char* body = NextFrame(&h);
    if (dead_) return -1;
    if (body == nullptr) {
      if (read || !ReadSome()) return dead_ ? -1 : frames;
      read = true;
      continue;
    }
    if (!on_frame(h, body)) return frames;
    Advance(h);
    ++frames;
  }
}

}  // namespace ff
