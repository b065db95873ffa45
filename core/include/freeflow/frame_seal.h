// Sealing the frames of a direct connection: the TCP connection between two pod processes
// on different nodes that carries their QPs' traffic (docs/direct-path.md).
//
// The two routers agree a secret of kDirectSecretBytes per connection over their TLS node
// link and hand it to both ends with the socket. Each end derives a key and an IV per
// direction from it (HKDF-SHA256; the label names the direction and the mode, so the two
// directions never share a nonce and ends that disagree on the mode fail the first frame).
// A frame is sealed with AES-128-GCM under the nonce IV xor its sequence number, which each
// direction counts from 0 and never sends: a frame replayed, reordered, dropped or injected
// fails authentication at the receiver, which then ends that connection.
//
// Two modes: kEncrypt (the default) encrypts the body and authenticates it with the frame's
// head; kAuthenticate sends the body in clear and authenticates both (GMAC), for clusters
// whose pod network already encrypts.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <memory>

namespace ff {

inline constexpr size_t kDirectSecretBytes = 32;
inline constexpr size_t kSealTagBytes = 16;

enum class SealMode : uint8_t {
  kEncrypt = 1,       // AES-128-GCM over the body, the head authenticated
  kAuthenticate = 2,  // GMAC over head and body, the body in clear
};

// Which end of a connection: the one whose router dialled it, or the one that accepted.
enum class DirectRole : uint8_t { kDialler = 1, kAcceptor = 2 };

// One direction of a connection: seals the frames one end sends, or opens the frames it
// receives. Frames must be sealed and opened in the same order (the sequence numbers).
class FrameCipher {
 public:
  enum class Direction { kSend, kReceive };
  FrameCipher();
  ~FrameCipher();
  FrameCipher(const FrameCipher&) = delete;
  FrameCipher& operator=(const FrameCipher&) = delete;
  FrameCipher(FrameCipher&&) noexcept;
  FrameCipher& operator=(FrameCipher&&) noexcept;

  // Derives this direction's key and IV: `self` is the role of the end that holds this
  // cipher; kSend seals what `self` sends, kReceive opens what its peer sends. `first`: the
  // sequence number of the next frame (an end that takes over a connection after its
  // router opened the first frames). false when the library fails (out of memory).
  bool Init(const uint8_t (&secret)[kDirectSecretBytes], DirectRole self, Direction dir,
            SealMode mode, uint64_t first = 0);

  // Seals the next frame: `head` (sent in clear) and the `n` body pieces of `body` are
  // authenticated; the body's bytes go to `out` (encrypted with kEncrypt, as they are with
  // kAuthenticate), its tag to `tag`. `out` may be the body's single piece (in place).
  bool Seal(const void* head, size_t head_len, const iovec* body, int n, char* out,
            uint8_t (&tag)[kSealTagBytes]);
  // Opens the next frame in place: false when `tag` does not authenticate `head` and `body`
  // under the expected sequence number (forged, replayed, reordered or corrupt); the body
  // is then garbage and the connection must end.
  bool Open(const void* head, size_t head_len, char* body, size_t body_len,
            const uint8_t (&tag)[kSealTagBytes]);

  uint64_t sequence() const { return seq_; }
  SealMode mode() const { return mode_; }

  // Which code seals and opens. kVector: intel-ipsec-mb's AVX2 or AVX-512 (VAES) AES-GCM,
  // the fastest at every size, chosen by Init when the CPU has it (VectorAvailable).
  // kPortable: bodies of at most kSmallBody bytes by the implementation with the lower
  // set-up cost per frame, larger ones by the one with the higher throughput (the .cc says
  // which and why). The output is the same standard AES-128-GCM whichever seals it.
  enum class Engine : uint8_t { kPortable, kVector };
  static bool VectorAvailable();
  Engine engine() const { return engine_; }
  // Tests and benchmarks: after Init, seal and open with `e` (kVector only where available;
  // false otherwise, the engine unchanged).
  bool set_engine(Engine e);
  static constexpr size_t kSmallBody = 768;
  // Moves that bound for this cipher's portable engine (tests and benchmarks: 0 sends every
  // frame to the throughput implementation, SIZE_MAX every one to the other).
  void set_small_body_limit(size_t bytes) { small_limit_ = bytes; }

 private:
  struct State;
  void Nonce(uint8_t (&nonce)[12]) const;
  bool Start(bool encrypt);
  bool Small(size_t head_len, size_t body_len) const;
  void SmallFrame(const void* head, size_t head_len, char* body, size_t body_len, bool seal,
                  uint8_t (&tag)[kSealTagBytes]);
  void SmallSeal(const void* head, size_t head_len, const iovec* body, int n, char* out,
                 uint8_t (&tag)[kSealTagBytes]);
  bool SmallOpen(const void* head, size_t head_len, char* body, size_t body_len,
                 const uint8_t (&tag)[kSealTagBytes]);
  void VectorFrame(const void* head, size_t head_len, const iovec* body, int n, char* out,
                   bool seal, uint8_t (&tag)[kSealTagBytes]);
  std::unique_ptr<State> state_;
  uint64_t seq_ = 0;
  SealMode mode_ = SealMode::kEncrypt;
  Engine engine_ = Engine::kPortable;
  size_t small_limit_ = kSmallBody;
};

// A fresh secret from the system's random source. false when it has none.
bool NewDirectSecret(uint8_t (&secret)[kDirectSecretBytes]);

}  // namespace ff
