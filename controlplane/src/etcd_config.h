// What the etcd implementation needs to reach etcd, checked and read by MakeControlPlane:
// the gRPC targets of the URLs in "etcd:URL[,URL...]", whether they speak TLS, the PEM
// contents of the TLS files, and the credentials of etcd's user/password authentication.
// No gRPC here, so that builds without etcd support check specs the same way.
#pragma once

#include <string>
#include <vector>

#include "freeflow/controlplane.h"

namespace ff::cp {

struct EtcdConnection {
  std::vector<std::string> targets;  // "host:port", tried in turn
  bool tls = false;
  std::string ca_pem;    // empty: the system's roots
  std::string cert_pem;  // client certificate chain and key: both or neither
  std::string key_pem;
  std::string user;  // empty: no Authenticate
  std::string password;
};

// Checks `list` (the part after "etcd:") and `security`, and reads the files it names.
// false + *error (naming the endpoint, flag or file at fault) when:
//   - an endpoint is not http://HOST:PORT, https://HOST:PORT or HOST:PORT;
//   - http:// and https:// endpoints are mixed, or an http:// endpoint comes with TLS
//     files (the user asked for TLS: talking in plaintext would silently drop it);
//   - a client certificate is given without its key, or a key without its certificate;
//   - a file cannot be read or holds no PEM block;
//   - a password is given without a user, or a user without a password.
// An endpoint without a scheme uses TLS when a TLS file is given or another endpoint is
// https://. A user and password over plaintext are allowed, with a warning in the log.
bool MakeEtcdConnection(const std::string& list, const EtcdSecurity& security,
                        EtcdConnection* connection, std::string* error);

}  // namespace ff::cp
