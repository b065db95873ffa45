#include "etcd_config.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "freeflow/tunables.h"

namespace ff::cp {
namespace {

enum class Scheme { kNone, kHttp, kHttps };

std::string Trim(std::string s) {
  const auto b = s.find_first_not_of(" \t");
  const auto e = s.find_last_not_of(" \t");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

// "http://host:port", "https://host:port", "host:port" -> "host:port" and its scheme.
// Empty + *error otherwise.
std::string TargetFromUrl(const std::string& url, Scheme* scheme, std::string* error) {
  std::string rest = url;
  *scheme = Scheme::kNone;
  if (rest.starts_with("https://")) {
    *scheme = Scheme::kHttps;
    rest = rest.substr(8);
  } else if (rest.starts_with("http://")) {
    *scheme = Scheme::kHttp;
    rest = rest.substr(7);
  }
  while (!rest.empty() && rest.back() == '/') rest.pop_back();
  const auto colon = rest.rfind(':');
  const bool has_port = colon != std::string::npos && colon + 1 < rest.size() &&
                        rest.find_first_not_of("0123456789", colon + 1) == std::string::npos;
  if (rest.empty() || rest.find('/') != std::string::npos || !has_port || colon == 0) {
    *error = fmt::format(
        "etcd endpoint \"{}\" is not of the form http://HOST:PORT, https://HOST:PORT or "
        "HOST:PORT",
        url);
    return {};
  }
  const int port = std::stoi(rest.substr(colon + 1, 6));
  if (port < 1 || port > 65535 || rest.size() - colon - 1 > 5) {
    *error = fmt::format("etcd endpoint \"{}\": the port is not in 1-65535", url);
    return {};
  }
  return rest;
}

// Reads the PEM file `path` given by `flag` into *pem. false + *error naming both.
bool ReadPem(const std::string& path, const char* flag, std::string* pem, std::string* error) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  int err = fd < 0 ? errno : 0;
  pem->clear();
  char buf[8192];
  while (err == 0 && pem->size() <= kMaxPemBytes) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n == 0) break;
    if (n > 0)
      pem->append(buf, static_cast<size_t>(n));
    else if (errno != EINTR)
      err = errno;
  }
  if (fd >= 0) ::close(fd);
  if (err != 0) {
    *error = fmt::format("cannot read {} file {}: {}", flag, path, std::strerror(err));
    return false;
  }
  if (pem->size() > kMaxPemBytes || pem->find("-----BEGIN ") == std::string::npos) {
    *error = fmt::format("{} file {} is not a PEM file (no -----BEGIN line, or over {} MiB)", flag,
                         path, kMaxPemBytes >> 20);
    return false;
  }
  return true;
}

using Bio = std::unique_ptr<BIO, decltype(&BIO_free)>;

Bio MemoryBio(const std::string& pem) {
  return Bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())), &BIO_free);
}

// How many certificates `pem` holds; stops at the first block that is not one.
int CountCertificates(const std::string& pem) {
  Bio bio = MemoryBio(pem);
  int count = 0;
  while (X509* cert = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
    X509_free(cert);
    ++count;
  }
  ERR_clear_error();
  return count;
}

// The CA bundle holds certificates, the client certificate is one, the key is a private
// key and belongs to that certificate: gRPC would otherwise fail later, with no word about
// which file is wrong.
bool CheckTlsFiles(const EtcdSecurity& security, const EtcdConnection& c, std::string* error) {
  if (!c.ca_pem.empty() && CountCertificates(c.ca_pem) == 0) {
    *error = fmt::format("etcd CA (--etcd-cacert) file {} holds no certificate", security.cacert);
    return false;
  }
  if (c.cert_pem.empty()) return true;
  Bio cert_bio = MemoryBio(c.cert_pem);
  std::unique_ptr<X509, decltype(&X509_free)> cert(
      PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr), &X509_free);
  Bio key_bio = MemoryBio(c.key_pem);
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(
      PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr), &EVP_PKEY_free);
  ERR_clear_error();
  if (!cert) {
    *error = fmt::format("etcd client certificate (--etcd-cert) file {} holds no certificate",
                         security.cert);
  } else if (!key) {
    *error = fmt::format(
        "etcd client key (--etcd-key) file {} holds no private key (or one with a passphrase)",
        security.key);
  } else if (X509_check_private_key(cert.get(), key.get()) != 1) {
    ERR_clear_error();
    *error = fmt::format(
        "etcd client key (--etcd-key) file {} does not belong to the certificate in {} "
        "(--etcd-cert)",
        security.key, security.cert);
  } else {
    return true;
  }
  return false;
}

// Splits `list` into targets; *tls from the schemes and whether TLS files are given.
bool ParseEndpoints(const std::string& list, bool tls_files, EtcdConnection* connection,
                    std::string* error) {
  bool http = false, https = false;
  std::string plain_url;
  size_t begin = 0;
  while (begin <= list.size()) {
    size_t end = list.find(',', begin);
    if (end == std::string::npos) end = list.size();
    const std::string url = Trim(list.substr(begin, end - begin));
    begin = end + 1;
    if (url.empty()) continue;
    Scheme scheme;
    std::string target = TargetFromUrl(url, &scheme, error);
    if (target.empty()) return false;
    if (scheme == Scheme::kHttp && plain_url.empty()) plain_url = url;
    http |= scheme == Scheme::kHttp;
    https |= scheme == Scheme::kHttps;
    connection->targets.push_back(std::move(target));
  }
  if (connection->targets.empty()) {
    *error = "control plane spec \"etcd:\" names no endpoint; use etcd:http://HOST:2379";
    return false;
  }
  if (http && https) {
    *error = fmt::format("etcd endpoints \"{}\" mix http:// and https://; use one for all", list);
    return false;
  }
  if (http && tls_files) {
    *error = fmt::format(
        "etcd endpoint \"{}\" is plaintext (http://) but TLS files are given "
        "(--etcd-cacert/--etcd-cert/--etcd-key or ETCDCTL_CACERT/ETCDCTL_CERT/ETCDCTL_KEY); "
        "use https:// to talk to etcd over TLS, or drop the TLS files",
        plain_url);
    return false;
  }
  connection->tls = https || tls_files;
  return true;
}

}  // namespace

bool MakeEtcdConnection(const std::string& list, const EtcdSecurity& security,
                        EtcdConnection* connection, std::string* error) {
  *connection = {};
  const bool tls_files =
      !security.cacert.empty() || !security.cert.empty() || !security.key.empty();
  if (!ParseEndpoints(list, tls_files, connection, error)) return false;
  if (security.cert.empty() != security.key.empty()) {
    *error = security.cert.empty()
                 ? "an etcd client key is given (--etcd-key or ETCDCTL_KEY) without its "
                   "certificate: give --etcd-cert (or ETCDCTL_CERT) too"
                 : "an etcd client certificate is given (--etcd-cert or ETCDCTL_CERT) without "
                   "its key: give --etcd-key (or ETCDCTL_KEY) too";
    return false;
  }
  if (!security.cacert.empty() &&
      !ReadPem(security.cacert, "etcd CA (--etcd-cacert)", &connection->ca_pem, error))
    return false;
  if (!security.cert.empty() &&
      (!ReadPem(security.cert, "etcd client certificate (--etcd-cert)", &connection->cert_pem,
                error) ||
       !ReadPem(security.key, "etcd client key (--etcd-key)", &connection->key_pem, error)))
    return false;
  if (!CheckTlsFiles(security, *connection, error)) return false;
  if (security.user.empty() && !security.password.empty()) {
    *error =
        "an etcd password is given (--etcd-password or ETCDCTL_PASSWORD) without a user: "
        "give --etcd-user (or ETCDCTL_USER) too";
    return false;
  }
  if (!security.user.empty() && security.password.empty()) {
    *error = fmt::format(
        "etcd user \"{}\" has no password: give --etcd-user {}:PASSWORD, --etcd-password or "
        "ETCDCTL_PASSWORD (or drop the user and let etcd take the client certificate's CN)",
        security.user, security.user);
    return false;
  }
  connection->user = security.user;
  connection->password = security.password;
  if (!connection->user.empty() && !connection->tls)
    spdlog::warn(
        "control plane: etcd user \"{}\" authenticates over plaintext http://: its password "
        "and token cross the network in clear; use https:// endpoints",
        connection->user);
  return true;
}

}  // namespace ff::cp
