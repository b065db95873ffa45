// Fuzz target: what arrives on a direct connection (core direct_stream.h), the frames a peer
// process sends and bytes anything else injects into the stream. The input is a script:
//   0  the peer puts a frame (any type, channel and body of up to kMaxBody + 64 bytes), and
//      writes what it put or not (small frames put between two writes go as one batch)
//   1  raw bytes of the input are written into the connection, unsealed
//   2  the receiver takes what arrived, sometimes leaving a frame for later
// The receiver must never read outside a frame, must hand out exactly the peer's frames in
// their order, and nothing once unsealed bytes came before them: a frame handed out that the
// peer did not seal, or one out of order, aborts.
#include <fuzzer/FuzzedDataProvider.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <string>

#include "freeflow/direct_stream.h"

namespace {

struct Sent {
  uint16_t type;
  uint32_t chan;
  std::string body;
};

struct Rig {
  int raw = -1;  // the peer's side of the connection, for unsealed bytes
  std::unique_ptr<ff::DirectStream> peer, self;
  std::deque<Sent> expected;  // sealed before any unsealed bytes went in, not taken yet
  bool injected = false;      // unsealed bytes went in: nothing sealed after them can open
};

bool Setup(Rig* r) {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv) != 0) return false;
  static uint8_t secret[ff::kDirectSecretBytes] = {1, 2, 3, 4};
  r->raw = sv[0];
  r->peer = std::make_unique<ff::DirectStream>(ff::UniqueFd(sv[0]));
  r->self = std::make_unique<ff::DirectStream>(ff::UniqueFd(sv[1]));
  ff::DirectStream::Setup s;
  s.secret = &secret;
  s.role = ff::DirectRole::kDialler;
  if (!r->peer->Init(s)) return false;
  s.role = ff::DirectRole::kAcceptor;
  if (!r->self->Init(s)) return false;
  // The receiver says that it takes batches, as every end does in its frames: the peer
  // batches small frames from then on.
  const uint64_t credit = 0;
  iovec v{const_cast<uint64_t*>(&credit), sizeof(credit)};
  if (r->self->PutFrame(ff::direct::Type::kCredit, 0, 0, &v, 1) != ff::DirectStream::Put::kOk ||
      !r->self->Flush())
    return false;
  for (int i = 0; i < 100 && !r->peer->peer_takes_batches(); ++i)
    r->peer->Receive([](const ff::direct::Head&, char*) { return true; });
  return r->peer->peer_takes_batches();
}

// Takes what arrived; `keep_after` frames are consumed, the next is left for later.
void Take(Rig* r, int keep_after) {
  int offered = 0;
  r->self->Receive([&](const ff::direct::Head& h, char* body) {
    if (h.len > ff::direct::kMaxBody || r->expected.empty()) std::abort();
    const Sent& want = r->expected.front();
    if (static_cast<uint16_t>(h.type) != want.type || h.chan != want.chan ||
        std::string(body, h.len) != want.body)
      std::abort();
    if (++offered > keep_after) return false;  // left for the next take: not opened twice
    r->expected.pop_front();
    return true;
  });
}

void Seal(Rig* r, FuzzedDataProvider& in) {
  Sent s;
  s.type = in.ConsumeIntegralInRange<uint16_t>(0, 6);
  s.chan = in.ConsumeIntegral<uint32_t>();
  const size_t len = in.ConsumeIntegralInRange<size_t>(0, ff::direct::kMaxBody + 64);
  s.body = in.ConsumeBytesAsString(len);
  iovec v{s.body.data(), s.body.size()};
  const auto put = r->peer->PutFrame(static_cast<ff::direct::Type>(s.type), s.chan, 0, &v, 1);
  if (put == ff::DirectStream::Put::kOk && !r->injected) r->expected.push_back(s);
  if (in.ConsumeBool()) r->peer->Flush();
}

void Inject(Rig* r, FuzzedDataProvider& in) {
  // Whatever the peer has not sent yet would follow the injected bytes: send it first.
  r->peer->Flush();
  if (r->peer->unsent() > 0) return;
  const std::string junk = in.ConsumeBytesAsString(in.ConsumeIntegralInRange<size_t>(1, 512));
  if (::write(r->raw, junk.data(), junk.size()) > 0) r->injected = true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  Rig r;
  if (!Setup(&r)) return 0;
  for (int step = 0; step < 32 && in.remaining_bytes() > 0; ++step) {
    switch (in.ConsumeIntegralInRange<int>(0, 2)) {
      case 0:
        Seal(&r, in);
        break;
      case 1:
        Inject(&r, in);
        break;
      default:
        Take(&r, in.ConsumeIntegralInRange<int>(0, 8));
        break;
    }
  }
  for (int i = 0; i < 64 && !r.self->dead(); ++i) {
    r.peer->Flush();
    Take(&r, 1 << 20);
  }
  return 0;
}
