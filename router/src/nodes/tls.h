// TLS 1.3 with mutual authentication for node links (OpenSSL). Every router holds a key and
// a certificate that names its node (scripts/ff-certs.sh makes them), signed by the
// cluster's CA; both ends of a link verify the other's chain against that CA during the
// handshake, and the transport then checks that the certificate names the node the peer
// claims to be (tcp_transport.cc). Kernel TLS is used when the kernel offers it; otherwise
// OpenSSL encrypts in user space.
#pragma once

#include <openssl/ssl.h>
#include <sys/types.h>

#include <memory>
#include <string>

namespace ff::router {

struct TlsFiles {
  std::string ca;    // PEM: the CA that signs every node's certificate
  std::string cert;  // PEM: this node's certificate
  std::string key;   // PEM: its private key
};

class TlsContext {
 public:
  // Loads the files and checks them: the key matches the certificate, and the certificate
  // names `node`. nullptr + *error (naming the file and what is wrong) when not.
  static std::shared_ptr<const TlsContext> Load(const TlsFiles& files, const std::string& node,
                                                std::string* error);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  SSL_CTX* get() const { return ctx_; }
  // The kernel offers TLS sockets: sessions hand their keys to it (SSL_OP_ENABLE_KTLS).
  bool kernel_tls() const { return kernel_tls_; }

 private:
  TlsContext(SSL_CTX* ctx, bool kernel_tls) : ctx_(ctx), kernel_tls_(kernel_tls) {}
  SSL_CTX* ctx_;
  bool kernel_tls_;
};

enum class TlsStatus { kDone, kWantRead, kWantWrite, kFailed };

// One end of a TLS link on a non-blocking socket. Records are read straight from the socket
// (OpenSSL reads ahead in large chunks). Without kernel TLS, written records go into a
// buffer pair and leave with one send() per batch: a write() per 16 KiB record, as OpenSSL
// does on a socket, cost more here than the encryption (3x the CPU per byte).
class TlsSession {
 public:
  // The client end when this router dialled. nullptr when OpenSSL cannot make one.
  static std::unique_ptr<TlsSession> Create(const TlsContext& ctx, int fd, bool client);
  ~TlsSession();
  TlsSession(const TlsSession&) = delete;
  TlsSession& operator=(const TlsSession&) = delete;

  // Advances the handshake and sends what it produced. On kFailed, *error says why (an
  // unverifiable certificate, a plaintext peer, ...). kWantWrite: the socket is full.
  TlsStatus Handshake(std::string* error);
  // recv() semantics: bytes, 0 when the peer closed, -1 with errno EAGAIN (wait for the
  // socket; *want_write: to become writable) or EPROTO / the socket's error.
  ssize_t Read(void* buf, size_t len, bool* want_write);
  // Encrypts up to `len` bytes into the send buffer: bytes taken, or -1 with errno EAGAIN
  // when the buffer is full (SendPending first) or EPROTO.
  ssize_t Write(const void* buf, size_t len);
  // Sends encrypted bytes. true when none are left; false when the socket is full or broken
  // (the read side reports the error).
  bool SendPending();
  // Tells the peer the session ends (a TLS close_notify) and sends it, without waiting: the
  // peer then reads an orderly end of the link (0), not a stream cut short (EPROTO).
  void Goodbye();
  bool HasUnsent() const;
  // True when OpenSSL holds received bytes that no read returned yet (epoll cannot see them).
  bool HasPending() const;
  // True once the handshake began: the peer's first handshake message was taken.
  bool Started() const;
  // True when the verified peer certificate names `node` (a DNS subjectAltName, or the
  // subject CN of a certificate without any).
  bool PeerIs(const std::string& node) const;
  std::string PeerSubject() const;  // for log lines
  // "TLSv1.3 TLS_AES_128_GCM_SHA256, kernel TLS" and the like.
  std::string Description() const;

 private:
  TlsSession(SSL* ssl, BIO* net, int fd) : ssl_(ssl), net_(net), fd_(fd) {}
  SSL* ssl_;
  BIO* net_;  // our end of the pair OpenSSL writes records into
  int fd_;
};

}  // namespace ff::router
