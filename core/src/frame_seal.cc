// AES-128-GCM, by three implementations of the one standard keyed alike. Where the CPU has
// them (x86-64 with AVX2, or AVX-512 with VAES and VPCLMULQDQ), intel-ipsec-mb's vector code
// seals every frame: on this project's AVX-512 machine about 15 GB/s over a 64 KiB body
// against OpenSSL's 3.3, and a 96-byte body in under half nettle's time (bench/seal_bench).
// Elsewhere the portable pair: OpenSSL's EVP interface for bodies over
// FrameCipher::kSmallBody bytes (its stitched AES and GHASH run about twice as fast as
// nettle's over a large body), nettle's for smaller ones (a frame's set-up through EVP, the
// nonce and the tag going by OpenSSL's parameter lookup, costs about three times nettle's
// whole seal of a 96-byte body). Each opens what the others sealed. The key schedules are set
// once per direction; each frame only sets its nonce.
#include "freeflow/frame_seal.h"

#include <nettle/gcm.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/rand.h>
#include <string.h>

#include <cstdio>
#include <utility>

#ifdef FF_HAVE_IPSEC_MB
#include <intel-ipsec-mb.h>
#endif

namespace ff {
namespace {

#ifdef FF_HAVE_IPSEC_MB
// The vector code's function table, set up once per process: nullptr when the CPU has
// neither AVX-512 nor AVX2 (ipsec-mb's SSE and AVX code seals no faster than the portable
// pair). Only read afterwards: its AES-GCM functions keep their state in the key and context
// the caller passes, so every thread may use it at once.
IMB_MGR* VectorCode() {
  static IMB_MGR* const mgr = []() -> IMB_MGR* {
    IMB_MGR* m = alloc_mb_mgr(0);
    if (m == nullptr) return nullptr;
    init_mb_mgr_auto(m, nullptr);
    if (imb_get_errno(m) != 0 ||
        (m->used_arch != IMB_ARCH_AVX512 && m->used_arch != IMB_ARCH_AVX2)) {
      free_mb_mgr(m);
      return nullptr;
    }
    return m;
  }();
  return mgr;
}
#endif

constexpr size_t kKeyBytes = 16;
constexpr size_t kIvBytes = 12;

const char* RoleName(DirectRole r) { return r == DirectRole::kDialler ? "dialler" : "acceptor"; }
const char* ModeName(SealMode m) { return m == SealMode::kEncrypt ? "encrypt" : "authenticate"; }

// HKDF-SHA256(secret, info) -> key || iv for the frames `sender` sends.
bool Derive(const uint8_t (&secret)[kDirectSecretBytes], DirectRole sender, SealMode mode,
            uint8_t* out, size_t out_len) {
  char info[64];
  const int n = snprintf(info, sizeof(info), "freeflow direct 1 %s %s", RoleName(sender),
                         ModeName(mode));
  // Fetched once: a fetch looks the algorithm up among OpenSSL's providers every time.
  static EVP_KDF* const kdf = EVP_KDF_fetch(nullptr, "HKDF", nullptr);
  if (kdf == nullptr) return false;
  EVP_KDF_CTX* kctx = EVP_KDF_CTX_new(kdf);
  if (kctx == nullptr) return false;
  char digest[] = "SHA256";
  OSSL_PARAM params[] = {
      OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, digest, 0),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, const_cast<uint8_t*>(secret),
                                        kDirectSecretBytes),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, info, static_cast<size_t>(n)),
      OSSL_PARAM_construct_end()};
  const bool ok = EVP_KDF_derive(kctx, out, out_len, params) == 1;
  EVP_KDF_CTX_free(kctx);
  return ok;
}

}  // namespace

struct FrameCipher::State {
  EVP_CIPHER_CTX* ctx = nullptr;
  gcm_aes128_ctx small;  // the same key, for bodies of at most small_limit_ bytes
#ifdef FF_HAVE_IPSEC_MB
  alignas(64) gcm_key_data vector;  // the same key, expanded for the vector code (kVector)
#endif
  uint8_t iv[kIvBytes] = {};
  ~State() {
    EVP_CIPHER_CTX_free(ctx);
    OPENSSL_cleanse(&small, sizeof(small));
#ifdef FF_HAVE_IPSEC_MB
    OPENSSL_cleanse(&vector, sizeof(vector));
#endif
  }
};

bool FrameCipher::VectorAvailable() {
#ifdef FF_HAVE_IPSEC_MB
  return VectorCode() != nullptr;
#else
  return false;
#endif
}

bool FrameCipher::set_engine(Engine e) {
  if (e == Engine::kVector && !VectorAvailable()) return false;
  engine_ = e;
  return true;
}

FrameCipher::FrameCipher() = default;
FrameCipher::~FrameCipher() = default;
FrameCipher::FrameCipher(FrameCipher&&) noexcept = default;
FrameCipher& FrameCipher::operator=(FrameCipher&&) noexcept = default;

bool FrameCipher::Init(const uint8_t (&secret)[kDirectSecretBytes], DirectRole self,
                       Direction dir, SealMode mode, uint64_t first) {
  const DirectRole peer = self == DirectRole::kDialler ? DirectRole::kAcceptor : DirectRole::kDialler;
  uint8_t material[kKeyBytes + kIvBytes];
  if (!Derive(secret, dir == Direction::kSend ? self : peer, mode, material, sizeof(material)))
    return false;
  static EVP_CIPHER* const gcm = EVP_CIPHER_fetch(nullptr, "AES-128-GCM", nullptr);
  if (gcm == nullptr) return false;
  auto st = std::make_unique<State>();
  st->ctx = EVP_CIPHER_CTX_new();
  const bool encrypt = dir == Direction::kSend;
  bool ok = st->ctx != nullptr &&
            EVP_CipherInit_ex(st->ctx, gcm, nullptr, nullptr, nullptr, encrypt) == 1 &&
            EVP_CIPHER_CTX_ctrl(st->ctx, EVP_CTRL_GCM_SET_IVLEN, kIvBytes, nullptr) == 1 &&
            EVP_CipherInit_ex(st->ctx, nullptr, nullptr, material, nullptr, encrypt) == 1;
  gcm_aes128_set_key(&st->small, material);
  engine_ = Engine::kPortable;
#ifdef FF_HAVE_IPSEC_MB
  if (IMB_MGR* v = VectorCode()) {
    IMB_AES128_GCM_PRE(v, material, &st->vector);
    engine_ = Engine::kVector;
  }
#endif
  memcpy(st->iv, material + kKeyBytes, kIvBytes);
  OPENSSL_cleanse(material, sizeof(material));
  if (!ok) return false;
  state_ = std::move(st);
  seq_ = first;
  mode_ = mode;
  return true;
}

// The nonce of the frame numbered seq_: the IV with the sequence number xored into its last
// eight bytes (big endian), as TLS 1.3 does.
void FrameCipher::Nonce(uint8_t (&nonce)[12]) const {
  memcpy(nonce, state_->iv, kIvBytes);
  for (int i = 0; i < 8; ++i) nonce[kIvBytes - 1 - i] ^= static_cast<uint8_t>(seq_ >> (8 * i));
}

bool FrameCipher::Start(bool encrypt) {
  uint8_t nonce[kIvBytes];
  Nonce(nonce);
  return EVP_CipherInit_ex(state_->ctx, nullptr, nullptr, nullptr, nonce, encrypt) == 1;
}

// Whether a frame of `head_len` and `body_len` takes the small-frame implementation. nettle
// takes authenticated data in pieces of whole blocks but the last, so a head that is not a
// whole number of blocks (never one of the wire's) goes to EVP when the body follows it
// as authenticated data.
bool FrameCipher::Small(size_t head_len, size_t body_len) const {
  return body_len <= small_limit_ &&
         (mode_ == SealMode::kEncrypt || head_len % GCM_BLOCK_SIZE == 0);
}

// One frame through the small-frame implementation, in place: `head` authenticated, the
// body authenticated (kAuthenticate) or encrypted (`seal`) or decrypted; its tag to `tag`.
void FrameCipher::SmallFrame(const void* head, size_t head_len, char* body, size_t body_len,
                             bool seal, uint8_t (&tag)[kSealTagBytes]) {
  gcm_aes128_ctx* g = &state_->small;
  uint8_t nonce[kIvBytes];
  Nonce(nonce);
  gcm_aes128_set_iv(g, kIvBytes, nonce);
  gcm_aes128_update(g, head_len, static_cast<const uint8_t*>(head));
  auto* b = reinterpret_cast<uint8_t*>(body);
  if (mode_ == SealMode::kAuthenticate)
    gcm_aes128_update(g, body_len, b);
  else if (seal)
    gcm_aes128_encrypt(g, body_len, b, b);
  else
    gcm_aes128_decrypt(g, body_len, b, b);
  gcm_aes128_digest(g, kSealTagBytes, tag);
}

void FrameCipher::SmallSeal(const void* head, size_t head_len, const iovec* body, int n, char* out,
                            uint8_t (&tag)[kSealTagBytes]) {
  size_t len = 0;
  for (int i = 0; i < n; ++i) {  // nettle takes one contiguous body: gathered into out
    // An empty piece may have no address (an empty vector's), nor `out` for an empty body.
    if (body[i].iov_len != 0 && body[i].iov_base != out + len)
      memcpy(out + len, body[i].iov_base, body[i].iov_len);
    len += body[i].iov_len;
  }
  SmallFrame(head, head_len, out, len, true, tag);
}

bool FrameCipher::SmallOpen(const void* head, size_t head_len, char* body, size_t body_len,
                            const uint8_t (&tag)[kSealTagBytes]) {
  uint8_t want[kSealTagBytes];
  SmallFrame(head, head_len, body, body_len, false, want);
  return CRYPTO_memcmp(want, tag, kSealTagBytes) == 0;
}

// One frame through the vector code: `head` authenticated; the `n` pieces of `body`
// authenticated and copied to `out` (kAuthenticate), or encrypted (`seal`) or decrypted into
// it (`out` may be the single piece: in place); the tag to `tag`.
void FrameCipher::VectorFrame(const void* head, size_t head_len, const iovec* body, int n,
                              char* out, bool seal, uint8_t (&tag)[kSealTagBytes]) {
#ifdef FF_HAVE_IPSEC_MB
  IMB_MGR* v = VectorCode();
  const gcm_key_data* key = &state_->vector;
  gcm_context_data g;
  uint8_t nonce[kIvBytes];
  Nonce(nonce);
  const auto* h = static_cast<const uint8_t*>(head);
  const bool mac_only = mode_ == SealMode::kAuthenticate;
  if (mac_only) {
    IMB_AES128_GMAC_INIT(v, key, &g, nonce, kIvBytes);
    IMB_AES128_GMAC_UPDATE(v, key, &g, h, head_len);
  } else {
    IMB_AES128_GCM_INIT_VAR_IV(v, key, &g, nonce, kIvBytes, h, head_len);
  }
  for (int i = 0; i < n; ++i) {
    const size_t len = body[i].iov_len;
    if (len == 0) continue;  // an empty piece may have no address
    const auto* in = static_cast<const uint8_t*>(body[i].iov_base);
    auto* to = reinterpret_cast<uint8_t*>(out);
    if (mac_only) {
      IMB_AES128_GMAC_UPDATE(v, key, &g, in, len);
      if (to != in) memcpy(to, in, len);
    } else if (seal) {
      IMB_AES128_GCM_ENC_UPDATE(v, key, &g, to, in, len);
    } else {
      IMB_AES128_GCM_DEC_UPDATE(v, key, &g, to, in, len);
    }
    out += len;
  }
  if (mac_only)
    IMB_AES128_GMAC_FINALIZE(v, key, &g, tag, kSealTagBytes);
  else if (seal)
    IMB_AES128_GCM_ENC_FINALIZE(v, key, &g, tag, kSealTagBytes);
  else
    IMB_AES128_GCM_DEC_FINALIZE(v, key, &g, tag, kSealTagBytes);
#else
  (void)head, (void)head_len, (void)body, (void)n, (void)out, (void)seal, (void)tag;
#endif
}

bool FrameCipher::Seal(const void* head, size_t head_len, const iovec* body, int n, char* out,
                       uint8_t (&tag)[kSealTagBytes]) {
  if (!state_) return false;
  if (engine_ == Engine::kVector) {
    VectorFrame(head, head_len, body, n, out, true, tag);
    ++seq_;
    return true;
  }
  size_t body_len = 0;
  for (int i = 0; i < n; ++i) body_len += body[i].iov_len;
  if (Small(head_len, body_len)) {
    SmallSeal(head, head_len, body, n, out, tag);
    ++seq_;
    return true;
  }
  if (!Start(true)) return false;
  EVP_CIPHER_CTX* c = state_->ctx;
  int len = 0;
  if (EVP_EncryptUpdate(c, nullptr, &len, static_cast<const uint8_t*>(head),
                        static_cast<int>(head_len)) != 1)
    return false;
  for (int i = 0; i < n; ++i) {
    const auto* in = static_cast<const uint8_t*>(body[i].iov_base);
    const int bytes = static_cast<int>(body[i].iov_len);
    if (mode_ == SealMode::kAuthenticate) {
      if (EVP_EncryptUpdate(c, nullptr, &len, in, bytes) != 1) return false;
      if (bytes != 0 && out != body[i].iov_base) memcpy(out, in, body[i].iov_len);
    } else if (EVP_EncryptUpdate(c, reinterpret_cast<uint8_t*>(out), &len, in, bytes) != 1) {
      return false;
    }
    out += body[i].iov_len;
  }
  if (EVP_EncryptFinal_ex(c, nullptr, &len) != 1 ||
      EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, kSealTagBytes, tag) != 1)
    return false;
  ++seq_;
  return true;
}

bool FrameCipher::Open(const void* head, size_t head_len, char* body, size_t body_len,
                       const uint8_t (&tag)[kSealTagBytes]) {
  if (!state_) return false;
  if (engine_ == Engine::kVector) {
    const iovec v{body, body_len};
    uint8_t want[kSealTagBytes];
    VectorFrame(head, head_len, &v, 1, body, false, want);
    if (CRYPTO_memcmp(want, tag, kSealTagBytes) != 0) return false;
    ++seq_;
    return true;
  }
  if (Small(head_len, body_len)) {
    if (!SmallOpen(head, head_len, body, body_len, tag)) return false;
    ++seq_;
    return true;
  }
  if (!Start(false)) return false;
  EVP_CIPHER_CTX* c = state_->ctx;
  auto* b = reinterpret_cast<uint8_t*>(body);
  const int bytes = static_cast<int>(body_len);
  int len = 0;
  bool ok = EVP_DecryptUpdate(c, nullptr, &len, static_cast<const uint8_t*>(head),
                              static_cast<int>(head_len)) == 1;
  if (mode_ == SealMode::kAuthenticate)
    ok = ok && EVP_DecryptUpdate(c, nullptr, &len, b, bytes) == 1;
  else
    ok = ok && EVP_DecryptUpdate(c, b, &len, b, bytes) == 1;
  ok = ok && EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_TAG, kSealTagBytes,
                                 const_cast<uint8_t*>(tag)) == 1;
  uint8_t tail[16];
  ok = ok && EVP_DecryptFinal_ex(c, tail, &len) == 1;
  if (ok) ++seq_;
  return ok;
}

bool NewDirectSecret(uint8_t (&secret)[kDirectSecretBytes]) {
  return RAND_priv_bytes(secret, kDirectSecretBytes) == 1;
}

}  // namespace ff
