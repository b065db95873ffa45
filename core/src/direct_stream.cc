#include "freeflow/direct_stream.h"

#include <fcntl.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace ff {
namespace {

constexpr size_t kReadChunk = 256 * 1024;  // what one receive may take

bool KnownType(direct::Type t) {
  return t == direct::Type::kHello || direct::BatchJoins(t) || t == direct::Type::kBatch;
}

constexpr size_t kHelloTagAt = sizeof(direct::Head) + sizeof(direct::Hello);

}  // namespace

bool SealHello(const uint8_t (&secret)[kDirectSecretBytes], SealMode mode,
               const direct::Hello& hello, char (&frame)[direct::kHelloFrameBytes]) {
  FrameCipher tx;
  if (!tx.Init(secret, DirectRole::kDialler, FrameCipher::Direction::kSend, mode)) return false;
  const direct::Head h{sizeof(direct::Hello), direct::Type::kHello, 0, 0, 0};
  std::memcpy(frame, &h, sizeof(h));
  iovec v{const_cast<direct::Hello*>(&hello), sizeof(hello)};
  uint8_t tag[kSealTagBytes];
  if (!tx.Seal(&h, sizeof(h), &v, 1, frame + sizeof(h), tag)) return false;
  std::memcpy(frame + kHelloTagAt, tag, sizeof(tag));
  return true;
}

bool OpenHello(const uint8_t (&secret)[kDirectSecretBytes], SealMode mode,
               const char (&frame)[direct::kHelloFrameBytes], direct::Hello* hello) {
  direct::Head h;
  std::memcpy(&h, frame, sizeof(h));
  if (h.type != direct::Type::kHello || h.len != sizeof(direct::Hello)) return false;
  char body[sizeof(direct::Hello)];
  std::memcpy(body, frame + sizeof(h), sizeof(body));
  uint8_t tag[kSealTagBytes];
  std::memcpy(tag, frame + kHelloTagAt, sizeof(tag));
  FrameCipher rx;
  if (!rx.Init(secret, DirectRole::kAcceptor, FrameCipher::Direction::kReceive, mode) ||
      !rx.Open(frame, sizeof(h), body, sizeof(body), tag))
    return false;
  std::memcpy(hello, body, sizeof(*hello));
  return true;
}

bool DirectStream::Init(const Setup& setup) {
  if (setup.secret == nullptr) return false;
  const int flags = ::fcntl(fd_.get(), F_GETFL);
  if (flags < 0 || ::fcntl(fd_.get(), F_SETFL, flags | O_NONBLOCK) != 0) return false;
  if (!tx_.Init(*setup.secret, setup.role, FrameCipher::Direction::kSend, setup.mode,
                setup.first_tx) ||
      !rx_.Init(*setup.secret, setup.role, FrameCipher::Direction::kReceive, setup.mode,
                setup.first_rx))
    return false;
  out_cap_ = send_limit_ + kFrameMax;
  out_ = std::make_unique_for_overwrite<char[]>(out_cap_);
  in_cap_ = kReadChunk + kFrameMax;
  in_ = std::make_unique_for_overwrite<char[]>(in_cap_);
  return true;
}

void DirectStream::set_send_limit(size_t bytes) {
  send_limit_ = out_cap_ == 0 ? bytes : std::min(bytes, out_cap_ - kFrameMax);
}

void DirectStream::Die(const char* why, bool violation) {
  const char* none = nullptr;
  if (why_.compare_exchange_strong(none, why) && violation)  // the first reason stays
    violated_.store(true, std::memory_order_release);
  dead_.store(true, std::memory_order_release);
}

bool DirectStream::Reserve(size_t bytes, Priority priority) {
  const size_t limit = send_limit_ + (priority == Priority::kAnswer ? kAnswerReserve : 0);
  if (unsent() > 0 && unsent() + bytes > limit) return false;
  if (out_len_ + bytes > out_cap_ && out_sent_ > 0) {  // the unsent bytes move to the front
    std::memmove(out_.get(), out_.get() + out_sent_, unsent());
    out_len_ -= out_sent_;
    if (batch_at_ != kNoBatch) batch_at_ -= out_sent_;  // opened after the last write
    out_sent_ = 0;
  }
  if (out_len_ + bytes > out_cap_) {  // answers beyond the send limit: a larger buffer
    const size_t cap = std::max(out_cap_ * 2, out_len_ + bytes);
    auto grown = std::make_unique_for_overwrite<char[]>(cap);
    std::memcpy(grown.get(), out_.get(), out_len_);
    out_ = std::move(grown);
    out_cap_ = cap;
  }
  return true;
}

bool DirectStream::SealAt(char* p, const direct::Head& h, const iovec* body, int n) {
  std::memcpy(p, &h, sizeof(h));
  uint8_t tag[kSealTagBytes];
  if (!tx_.Seal(p, sizeof(h), body, n, p + sizeof(h), tag)) {
    Die("the cipher failed to seal a frame");
    return false;
  }
  std::memcpy(p + sizeof(h) + h.len, tag, sizeof(tag));
  out_len_ = static_cast<size_t>(p - out_.get()) + sizeof(h) + h.len + sizeof(tag);
  return true;
}

bool DirectStream::CloseBatch() {
  if (batch_at_ == kNoBatch) return true;
  char* p = out_.get() + batch_at_;
  batch_at_ = kNoBatch;
  const size_t len = static_cast<size_t>(out_.get() + out_len_ - p) - sizeof(direct::Head);
  direct::Head h;
  std::memcpy(&h, p + sizeof(h), sizeof(h));  // its first frame
  if (sizeof(h) + h.len == len) {  // alone, the frame goes as it is: no batch head around it
    std::memmove(p, p + sizeof(h), len);
  } else {
    h = {static_cast<uint32_t>(len), direct::Type::kBatch, direct::kTakesBatches, 0, 0};
  }
  const iovec v{p + sizeof(h), h.len};
  return SealAt(p, h, &v, 1);
}

DirectStream::Put DirectStream::PutFrame(direct::Type type, uint32_t chan, uint16_t flags,
                                         const iovec* body, int n, Priority priority) {
  if (dead_) return Put::kDead;
  size_t len = 0;
  for (int i = 0; i < n; ++i) len += body[i].iov_len;
  if (len > direct::kMaxBody || type == direct::Type::kBatch) {
    Die(len > direct::kMaxBody ? "a frame over the largest body was put"
                               : "a batch was put as a frame");
    return Put::kDead;
  }
  const direct::Head h{static_cast<uint32_t>(len), type,
                       static_cast<uint16_t>(flags | direct::kTakesBatches), chan, 0};
  if (direct::BatchJoins(type) && len <= kBatchFrameMax && peer_takes_batches()) {
    // Into the open batch, or a new one (its head and tag counted now).
    const size_t bytes = sizeof(h) + len;
    const bool joins =
        batch_at_ != kNoBatch && out_len_ + bytes - batch_at_ - sizeof(h) <= kBatchBodyMax;
    // Room for this frame and its batch's tag, and for a new batch its head and the tag of
    // the one it closes.
    const size_t closes = batch_at_ != kNoBatch ? kSealTagBytes : 0;
    const size_t need = bytes + kSealTagBytes + (joins ? 0 : sizeof(h) + closes);
    if (!Reserve(need, priority)) return Put::kFull;
    if (!joins) {
      if (!CloseBatch()) return Put::kDead;
      batch_at_ = out_len_;
      out_len_ += sizeof(h);
    }
    char* p = out_.get() + out_len_;
    std::memcpy(p, &h, sizeof(h));
    p += sizeof(h);
    for (int i = 0; i < n; ++i) {
      if (body[i].iov_len > 0) std::memcpy(p, body[i].iov_base, body[i].iov_len);
      p += body[i].iov_len;
    }
    out_len_ += bytes;
    return Put::kOk;
  }
  const size_t bytes = sizeof(h) + len + kSealTagBytes;
  if (!Reserve(bytes + (batch_at_ != kNoBatch ? kSealTagBytes : 0), priority)) return Put::kFull;
  if (!CloseBatch()) return Put::kDead;  // what was put before goes first
  return SealAt(out_.get() + out_len_, h, body, n) ? Put::kOk : Put::kDead;
}

bool DirectStream::Flush() {
  if (!dead_ && !CloseBatch()) return false;
  while (!dead_ && out_sent_ < out_len_) {
    const ssize_t w = ::send(fd_.get(), out_.get() + out_sent_, out_len_ - out_sent_,
                             MSG_DONTWAIT | MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN) Die("the connection failed while sending");
      break;
    }
    out_sent_ += static_cast<size_t>(w);
  }
  if (out_sent_ == out_len_) out_sent_ = out_len_ = 0;
  return !dead_;
}

bool DirectStream::ReadSome() {
  if (in_off_ == in_have_) {
    in_off_ = in_have_ = 0;
  } else if (in_cap_ - in_have_ < kReadChunk / 2) {  // the unread tail moves to the front
    std::memmove(in_.get(), in_.get() + in_off_, in_have_ - in_off_);
    in_have_ -= in_off_;
    in_off_ = 0;
  }
  if (in_have_ == in_cap_) return false;  // never: a partial frame always leaves room
  for (;;) {
    const size_t room = in_cap_ - in_have_;
    const ssize_t r = ::recv(fd_.get(), in_.get() + in_have_, room, MSG_DONTWAIT);
    drained_ = r <= 0 || static_cast<size_t>(r) < room;
    if (r > 0) {
      in_have_ += static_cast<size_t>(r);
      return true;
    }
    if (r == 0) {
      Die("the peer closed the connection");
    } else if (errno == EINTR) {
      continue;
    } else if (errno != EAGAIN) {
      Die("the connection failed while receiving");
    }
    return false;
  }
}

void DirectStream::Advance(const direct::Head& h) {
  const size_t bytes = sizeof(h) + h.len;
  in_off_ += bytes;
  if (batch_left_ > 0) {  // a frame of a batch: no tag of its own
    batch_left_ -= bytes;
    if (batch_left_ == 0) in_off_ += kSealTagBytes;
    return;
  }
  in_off_ += kSealTagBytes;
  opened_ = false;
}

char* DirectStream::NextFrame(direct::Head* head) {
  if (batch_left_ > 0) {  // the next frame of an opened batch, whole and authenticated
    char* p = in_.get() + in_off_;
    if (batch_left_ >= sizeof(*head)) std::memcpy(head, p, sizeof(*head));
    if (batch_left_ < sizeof(*head) || !direct::BatchJoins(head->type) ||
        head->len > batch_left_ - sizeof(*head)) {
      Die("the peer sent a batch the wire does not allow", true);
      return nullptr;
    }
    return p + sizeof(*head);
  }
  const size_t avail = in_have_ - in_off_;
  if (avail < sizeof(direct::Head)) return nullptr;
  char* p = in_.get() + in_off_;
  std::memcpy(head, p, sizeof(*head));
  if (head->len > direct::kMaxBody || !KnownType(head->type)) {
    Die("the peer sent a frame the wire does not allow", true);
    return nullptr;
  }
  if (avail < sizeof(*head) + head->len + kSealTagBytes) {
    if (in_off_ + kFrameMax > in_cap_) {  // make room for the whole frame
      std::memmove(in_.get(), p, avail);
      in_off_ = 0;
      in_have_ = avail;
    }
    return nullptr;
  }
  char* body = p + sizeof(*head);
  if (!opened_) {
    uint8_t tag[kSealTagBytes];
    std::memcpy(tag, body + head->len, sizeof(tag));
    if (!rx_.Open(p, sizeof(*head), body, head->len, tag)) {
      Die("a frame did not open: forged, replayed, reordered or corrupt", true);
      return nullptr;
    }
    opened_ = true;
    if ((head->flags & direct::kTakesBatches) != 0 && !peer_takes_batches())
      peer_batches_.store(true, std::memory_order_relaxed);
  }
  if (head->type == direct::Type::kBatch) {  // its frames are handed out one by one
    if (head->len == 0) {
      Die("the peer sent a batch the wire does not allow", true);
      return nullptr;
    }
    in_off_ += sizeof(*head);
    batch_left_ = head->len;
    opened_ = false;
    return NextFrame(head);
  }
  return body;
}

}  // namespace ff
