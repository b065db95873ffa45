#include "nodes/tls.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/x509v3.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <utility>

#include "freeflow/tunables.h"

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

// Checks that the certificate the context loaded names this node.
bool CheckOwnName(SSL_CTX* ctx, const TlsFiles& files, const std::string& node,
                  std::string* error) {
  X509* own = SSL_CTX_get0_certificate(ctx);
  if (Names(own, node)) return true;
  *error = files.cert + " is the certificate of " + Subject(own) + ", not of node '" + node +
           "' (--node-name); make one with scripts/ff-certs.sh DIR node " + node;
  return false;
}

// True when this kernel offers TLS on TCP sockets (the "tls" upper-layer protocol): tried on
// a connection over loopback, since the module may be absent or not loadable.
bool ProbeKernelTls() {
  const int lfd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int cfd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  bool ok = lfd >= 0 && cfd >= 0 && ::bind(lfd, reinterpret_cast<sockaddr*>(&a), len) == 0 &&
            ::listen(lfd, 1) == 0 &&
            ::getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len) == 0 &&
            ::connect(cfd, reinterpret_cast<sockaddr*>(&a), len) == 0;
  ok = ok && ::setsockopt(cfd, IPPROTO_TCP, TCP_ULP, "tls", sizeof("tls")) == 0;
  if (lfd >= 0) ::close(lfd);
  if (cfd >= 0) ::close(cfd);
  return ok;
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
  std::shared_ptr<TlsContext> ctx(new TlsContext(raw, ProbeKernelTls()));
  const auto failed = [&](const std::string& what) {
    *error = what + ": " + Drain();
    return nullptr;
  };
  const std::pair<const char*, const std::string*> named[] = {{"the node certificate", &files.cert},
                                                              {"the node key", &files.key},
                                                              {"the CA certificate", &files.ca}};
  for (const auto& [what, path] : named) {
    if (::access(path->c_str(), R_OK) != 0) {
      *error = std::string("cannot read ") + what + " " + *path + ": " + std::strerror(errno);
      return nullptr;
    }
  }
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
  SSL_CTX_set_mode(raw, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  SSL_CTX_set_options(raw, SSL_OP_ENABLE_KTLS | SSL_OP_NO_RENEGOTIATION);
  // Read whole bursts of records with one system call.
  SSL_CTX_set_read_ahead(raw, 1);
  SSL_CTX_set_default_read_buffer_len(raw, 256 * 1024);
  return ctx;
}

TlsContext::~TlsContext() { SSL_CTX_free(ctx_); }

std::unique_ptr<TlsSession> TlsSession::Create(const TlsContext& ctx, int fd, bool client) {
  SSL* ssl = SSL_new(ctx.get());
  BIO* inner = nullptr;
  BIO* net = nullptr;
  // With kernel TLS, OpenSSL hands the keys to the kernel and writes to the socket itself.
  const bool ok =
      ssl != nullptr &&
      (ctx.kernel_tls() ? SSL_set_fd(ssl, fd) == 1
                        : SSL_set_rfd(ssl, fd) == 1 &&
                              BIO_new_bio_pair(&inner, kTlsSendBuffer, &net, kTlsSendBuffer) == 1);
  if (!ok) {
    ERR_clear_error();
    SSL_free(ssl);
    return nullptr;
  }
  if (inner != nullptr) SSL_set0_wbio(ssl, inner);  // the SSL owns `inner` now
  if (client) {
    SSL_set_connect_state(ssl);
  } else {
    SSL_set_accept_state(ssl);
  }
  return std::unique_ptr<TlsSession>(new TlsSession(ssl, net, fd));
}

TlsSession::~TlsSession() {
  SSL_free(ssl_);
  if (net_ != nullptr) BIO_free(net_);
}

TlsStatus TlsSession::Handshake(std::string* error) {
  ERR_clear_error();
  const int rc = SSL_do_handshake(ssl_);
  const int e = rc == 1 ? SSL_ERROR_NONE : SSL_get_error(ssl_, rc);
  if (e == SSL_ERROR_NONE || e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
    if (!SendPending()) return TlsStatus::kWantWrite;
    return e == SSL_ERROR_NONE ? TlsStatus::kDone : TlsStatus::kWantRead;
  }
  const long verify = SSL_get_verify_result(ssl_);
  std::string why = Drain();
  if (verify != X509_V_OK) {
    why = std::string("peer certificate refused: ") + X509_verify_cert_error_string(verify);
  } else if (e == SSL_ERROR_SYSCALL) {
    why = errno != 0 ? std::strerror(errno) : "the peer closed the connection during the handshake";
  }
  *error = "TLS handshake failed: " + (why.empty() ? "unknown error" : why);
  return TlsStatus::kFailed;
}

bool TlsSession::PeerIs(const std::string& node) const {
  return SSL_get_verify_result(ssl_) == X509_V_OK && Names(SSL_get0_peer_certificate(ssl_), node);
}

std::string TlsSession::PeerSubject() const { return Subject(SSL_get0_peer_certificate(ssl_)); }

std::string TlsSession::Description() const {
  const bool ktx = net_ == nullptr && BIO_get_ktls_send(SSL_get_wbio(ssl_));
  const bool krx = BIO_get_ktls_recv(SSL_get_rbio(ssl_));
  const char* where = ktx && krx ? ", kernel TLS"
                      : ktx      ? ", kernel TLS send"
                      : krx      ? ", kernel TLS receive"
                                 : ", TLS in user space";
  return std::string(SSL_get_version(ssl_)) + " " + SSL_get_cipher_name(ssl_) + where;
}

namespace {

// Maps an OpenSSL I/O outcome onto the recv()/send() convention.
ssize_t Outcome(SSL* ssl, int rc, bool* want_write) {
  const int e = SSL_get_error(ssl, rc);
  if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) {
    *want_write = e == SSL_ERROR_WANT_WRITE;
    errno = EAGAIN;
    return -1;
  }
  if (e == SSL_ERROR_ZERO_RETURN) return 0;
  const int saved = errno;
  ERR_clear_error();
  errno = e == SSL_ERROR_SYSCALL && saved != 0 ? saved : EPROTO;
  return -1;
}

int ClampInt(size_t len) {
  return static_cast<int>(std::min<size_t>(len, std::numeric_limits<int>::max()));
}

}  // namespace

ssize_t TlsSession::Read(void* buf, size_t len, bool* want_write) {
  *want_write = false;
  ERR_clear_error();
  const int rc = SSL_read(ssl_, buf, ClampInt(len));
  if (rc > 0) return rc;
  return Outcome(ssl_, rc, want_write);
}

ssize_t TlsSession::Write(const void* buf, size_t len) {
  ERR_clear_error();
  const int rc = SSL_write(ssl_, buf, ClampInt(len));
  if (rc > 0) return rc;
  bool want_write = false;
  return Outcome(ssl_, rc, &want_write);
}

bool TlsSession::SendPending() {
  if (net_ == nullptr) return true;  // kernel TLS: nothing is held back
  for (;;) {
    char* p = nullptr;
    const int n = BIO_nread0(net_, &p);
    if (n <= 0) return true;
    const ssize_t sent = ::send(fd_, p, static_cast<size_t>(n), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent < 0 && errno == EINTR) continue;
    if (sent <= 0) return false;
    BIO_nread(net_, &p, static_cast<int>(sent));
    if (sent < n) return false;
  }
}

void TlsSession::Goodbye() {
  ERR_clear_error();
  if (SSL_shutdown(ssl_) < 0) ERR_clear_error();  // a full socket: the peer sees EOF instead
  SendPending();
}

bool TlsSession::HasUnsent() const { return net_ != nullptr && BIO_ctrl_pending(net_) > 0; }

bool TlsSession::HasPending() const { return SSL_has_pending(ssl_) == 1; }

bool TlsSession::Started() const { return SSL_in_before(ssl_) == 0; }

}  // namespace ff::router
