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
  return t == direct::Type::kHello || t == direct::Type::kRecord || t == direct::Type::kResp ||
         t == direct::Type::kCredit;
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

DirectStream::Put DirectStream::PutFrame(direct::Type type, uint32_t chan, uint16_t flags,
                                         const iovec* body, int n, Priority priority) {
  if (dead_) return Put::kDead;
  size_t len = 0;
  for (int i = 0; i < n; ++i) len += body[i].iov_len;
  if (len > direct::kMaxBody) {
    Die("a frame over the largest body was put");
    return Put::kDead;
  }
  const size_t bytes = sizeof(direct::Head) + len + kSealTagBytes;
  const size_t limit = send_limit_ + (priority == Priority::kAnswer ? kAnswerReserve : 0);
  if (unsent() > 0 && unsent() + bytes > limit) return Put::kFull;
  if (out_len_ + bytes > out_cap_) {  // the unsent bytes move to the front
    std::memmove(out_.get(), out_.get() + out_sent_, unsent());
    out_len_ -= out_sent_;
    out_sent_ = 0;
  }
  if (out_len_ + bytes > out_cap_) {  // answers beyond the send limit: a larger buffer
    const size_t cap = std::max(out_cap_ * 2, out_len_ + bytes);
    auto grown = std::make_unique_for_overwrite<char[]>(cap);
    std::memcpy(grown.get(), out_.get(), out_len_);
    out_ = std::move(grown);
    out_cap_ = cap;
  }
  char* p = out_.get() + out_len_;
  const direct::Head h{static_cast<uint32_t>(len), type, flags, chan, 0};
  std::memcpy(p, &h, sizeof(h));
  uint8_t tag[kSealTagBytes];
  if (!tx_.Seal(p, sizeof(h), body, n, p + sizeof(h), tag)) {
    Die("the cipher failed to seal a frame");
    return Put::kDead;
  }
  std::memcpy(p + sizeof(h) + len, tag, sizeof(tag));
  out_len_ += bytes;
  return Put::kOk;
}

bool DirectStream::Flush() {
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

char* DirectStream::NextFrame(direct::Head* head) {
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
  }
  return body;
}

}  // namespace ff
