#include "tls.h"

#include <openssl/err.h>
#include <openssl/x509v3.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>

namespace ff::router {
namespace {

// Everything OpenSSL queued on this thread, as one line; the queue is left empty.
std::string Drain() {
  std::string out;
  char buf[256];
  while (const unsigned long e = ERR_get_error()) {
    ERR_error_string_n(e, buf, sizeof(buf));
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out;
}

std::string Subject(X509* cert) {
  if (cert == nullptr) return "(no certificate)";
  char buf[256] = {};
  X509_NAME_oneline(X509_get_subject_name(cert), buf, sizeof(buf));
  return buf;
}

bool Names(X509* cert, const std::string& node) {
  return cert != nullptr && !node.empty() &&
         X509_check_host(cert, node.data(), node.size(), X509_CHECK_FLAG_NO_WILDCARDS, nullptr) ==
             1;
}

// Reads the node's own certificate again to check the name in it (the context keeps its
// own copy).
bool CheckOwnName(SSL_CTX* ctx, const TlsFiles& files, const std::string& node,
                  std::string* error) {
  X509* own = SSL_CTX_get0_certificate(ctx);
  if (Names(own, node)) return true;
  *error = files.cert + " is the certificate of " + Subject(own) + ", not of node '" + node +
           "' (--node-name); make one with scripts/ff-certs.sh DIR node " + node;
  return false;
}

}  // namespace

std::shared_ptr<const TlsContext> TlsContext::Load(const TlsFiles& files, const std::string& node,
                                                   std::string* error) {
  ERR_clear_error();
  SSL_CTX* raw = SSL_CTX_new(TLS_method());
  if (raw == nullptr) {
    *error = "cannot create a TLS context: " + Drain();
    return nullptr;
  }
  std::shared_ptr<TlsContext> ctx(new TlsContext(raw));
  const auto failed = [&](const std::string& what) {
    *error = what + ": " + Drain();
    return nullptr;
  };
  if (SSL_CTX_use_certificate_chain_file(raw, files.cert.c_str()) != 1)
    return failed("cannot read the node certificate " + files.cert);
  if (SSL_CTX_use_PrivateKey_file(raw, files.key.c_str(), SSL_FILETYPE_PEM) != 1)
    return failed("cannot read the node key " + files.key + ", or it is not the key of " +
                  files.cert);
  if (SSL_CTX_check_private_key(raw) != 1)
    return failed(files.key + " is not the key of " + files.cert);
  if (SSL_CTX_load_verify_locations(raw, files.ca.c_str(), nullptr) != 1)
    return failed("cannot read the CA certificate " + files.ca);
  if (!CheckOwnName(raw, files, node, error)) return nullptr;
  SSL_CTX_set_min_proto_version(raw, TLS1_3_VERSION);
  // AES-GCM first: the CPUs routers run on encrypt it in hardware.
  SSL_CTX_set_ciphersuites(raw,
                           "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:"
                           "TLS_CHACHA20_POLY1305_SHA256");
  SSL_CTX_set_verify(raw, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  SSL_CTX_set_num_tickets(raw, 0);  // links are long-lived: no resumption
  SSL_CTX_set_session_cache_mode(raw, SSL_SESS_CACHE_OFF);
  SSL_CTX_set_mode(raw, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER |
                            SSL_MODE_RELEASE_BUFFERS);
  SSL_CTX_set_options(raw, SSL_OP_ENABLE_KTLS | SSL_OP_NO_RENEGOTIATION);
  // Read whole bursts of records with one system call.
  SSL_CTX_set_read_ahead(raw, 1);
  SSL_CTX_set_default_read_buffer_len(raw, 256 * 1024);
  return ctx;
}

TlsContext::~TlsContext() { SSL_CTX_free(ctx_); }

SslPtr TlsContext::NewSession(int fd, bool client) const {
  SslPtr ssl(SSL_new(ctx_));
  if (ssl == nullptr || SSL_set_fd(ssl.get(), fd) != 1) {
    ERR_clear_error();
    return nullptr;
  }
  if (client) {
    SSL_set_connect_state(ssl.get());
  } else {
    SSL_set_accept_state(ssl.get());
  }
  return ssl;
}

TlsStatus TlsHandshake(SSL* ssl, std::string* error) {
  ERR_clear_error();
  const int rc = SSL_do_handshake(ssl);
  if (rc == 1) return TlsStatus::kDone;
  const int e = SSL_get_error(ssl, rc);
  if (e == SSL_ERROR_WANT_READ) return TlsStatus::kWantRead;
  if (e == SSL_ERROR_WANT_WRITE) return TlsStatus::kWantWrite;
  const long verify = SSL_get_verify_result(ssl);
  std::string why = Drain();
  if (verify != X509_V_OK) {
    why = std::string("peer certificate refused: ") + X509_verify_cert_error_string(verify);
  } else if (e == SSL_ERROR_SYSCALL) {
    why = errno != 0 ? std::strerror(errno) : "the peer closed the connection during the handshake";
  }
  *error = "TLS handshake failed: " + (why.empty() ? "unknown error" : why);
  return TlsStatus::kFailed;
}

bool TlsPeerIs(SSL* ssl, const std::string& node) {
  return SSL_get_verify_result(ssl) == X509_V_OK && Names(SSL_get0_peer_certificate(ssl), node);
}

std::string TlsPeerSubject(SSL* ssl) { return Subject(SSL_get0_peer_certificate(ssl)); }

std::string TlsDescription(SSL* ssl) {
  const bool ktx = BIO_get_ktls_send(SSL_get_wbio(ssl));
  const bool krx = BIO_get_ktls_recv(SSL_get_rbio(ssl));
  std::string out = std::string(SSL_get_version(ssl)) + " " + SSL_get_cipher_name(ssl);
  out += ktx && krx ? ", kernel TLS"
         : ktx      ? ", kernel TLS send"
         : krx      ? ", kernel TLS receive"
                    : ", TLS in user space";
  return out;
}

namespace {

// Maps an OpenSSL I/O outcome onto the recv()/send() convention.
ssize_t Outcome(SSL* ssl, int rc, bool* want_other, int other) {
  const int e = SSL_get_error(ssl, rc);
  if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
    *want_other = e == other;
    errno = EAGAIN;
    return -1;
  }
  if (e == SSL_ERROR_ZERO_RETURN) return 0;
  const int saved = errno;
  ERR_clear_error();
  errno = e == SSL_ERROR_SYSCALL && saved != 0 ? saved : EPROTO;
  return -1;
}

}  // namespace

ssize_t TlsRead(SSL* ssl, void* buf, size_t len, bool* want_write) {
  *want_write = false;
  ERR_clear_error();
  const int n = static_cast<int>(std::min<size_t>(len, std::numeric_limits<int>::max()));
  const int rc = SSL_read(ssl, buf, n);
  if (rc > 0) return rc;
  return Outcome(ssl, rc, want_write, SSL_ERROR_WANT_WRITE);
}

ssize_t TlsWrite(SSL* ssl, const void* buf, size_t len, bool* want_read) {
  *want_read = false;
  ERR_clear_error();
  const int n = static_cast<int>(std::min<size_t>(len, std::numeric_limits<int>::max()));
  const int rc = SSL_write(ssl, buf, n);
  if (rc > 0) return rc;
  return Outcome(ssl, rc, want_read, SSL_ERROR_WANT_READ);
}

bool TlsHasPending(SSL* ssl) { return SSL_has_pending(ssl) == 1; }

}  // namespace ff::router
