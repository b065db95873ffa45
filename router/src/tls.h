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

struct SslFree {
  void operator()(SSL* s) const { SSL_free(s); }
};
using SslPtr = std::unique_ptr<SSL, SslFree>;

class TlsContext {
 public:
  // Loads the files and checks them: the key matches the certificate, and the certificate
  // names `node`. nullptr + *error (naming the file and what is wrong) when not.
  static std::shared_ptr<const TlsContext> Load(const TlsFiles& files, const std::string& node,
                                                std::string* error);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  // A session on connected socket `fd`: the client end when this router dialled.
  SslPtr NewSession(int fd, bool client) const;

 private:
  explicit TlsContext(SSL_CTX* ctx) : ctx_(ctx) {}
  SSL_CTX* ctx_;
};

enum class TlsStatus { kDone, kWantRead, kWantWrite, kFailed };

// Advances the handshake. On kFailed, *error says why (an unverifiable certificate, a
// plaintext peer, ...).
TlsStatus TlsHandshake(SSL* ssl, std::string* error);
// True when the verified peer certificate names `node` (a DNS subjectAltName, or the
// subject CN of a certificate without any).
bool TlsPeerIs(SSL* ssl, const std::string& node);
// The peer certificate's subject, for log lines.
std::string TlsPeerSubject(SSL* ssl);
// "TLSv1.3 TLS_AES_128_GCM_SHA256, kernel TLS send+receive" and the like.
std::string TlsDescription(SSL* ssl);

// recv()/send() semantics: bytes moved; 0 when the peer closed (read); -1 with errno
// EAGAIN when the socket must become readable (or, *want_write set, writable) first, and
// EPROTO or the socket's error otherwise.
ssize_t TlsRead(SSL* ssl, void* buf, size_t len, bool* want_write);
ssize_t TlsWrite(SSL* ssl, const void* buf, size_t len, bool* want_read);
// True when OpenSSL holds received bytes that no read returned yet (epoll cannot see them).
bool TlsHasPending(SSL* ssl);

}  // namespace ff::router
