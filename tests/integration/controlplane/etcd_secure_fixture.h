// What the tests against an etcd with TLS, client certificates and authentication on
// share: certificates from scripts/ff-certs.sh (made once per suite), an etcd per test set
// up with scripts/ff-etcd-auth.sh (node-a and node-b with passwords, node-c with its
// certificate's CN only), routers with chosen credentials, and a raw etcd client.
#pragma once

#include <grpcpp/grpcpp.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "etcd_fixture.h"
#include "test_certs.h"

namespace ff::cp {

namespace pb = etcdserverpb;
inline const std::string kAuth = std::string("bash ") + FF_ETCD_AUTH;

inline std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// etcd's API with credentials of its own: what someone holding a router's certificate,
// and maybe its password, can do with them.
class Client {
 public:
  Client(const EtcdServer& etcd, const EtcdSecurity& security) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = Slurp(security.cacert);
    ssl.pem_cert_chain = Slurp(security.cert);
    ssl.pem_private_key = Slurp(security.key);
    auto channel = grpc::CreateChannel(etcd.target(), grpc::SslCredentials(ssl));
    kv_ = pb::KV::NewStub(channel);
    lease_ = pb::Lease::NewStub(channel);
    if (security.user.empty()) return;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + 2s);
    pb::AuthenticateRequest request;
    request.set_name(security.user);
    request.set_password(security.password);
    pb::AuthenticateResponse response;
    const auto status = pb::Auth::NewStub(channel)->Authenticate(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    token_ = response.token();
  }

  grpc::StatusCode Put(const std::string& key, const std::string& value) {
    grpc::ClientContext context;
    pb::PutRequest request;
    request.set_key(key);
    request.set_value(value);
    pb::PutResponse response;
    return kv_->Put(Prepare(&context), request, &response).error_code();
  }
  grpc::StatusCode Delete(const std::string& key, const std::string& range_end = "") {
    grpc::ClientContext context;
    pb::DeleteRangeRequest request;
    request.set_key(key);
    request.set_range_end(range_end);
    pb::DeleteRangeResponse response;
    return kv_->DeleteRange(Prepare(&context), request, &response).error_code();
  }
  grpc::StatusCode TxnPut(const std::string& key, const std::string& value) {
    grpc::ClientContext context;
    pb::TxnRequest request;
    auto* put = request.add_success()->mutable_request_put();
    put->set_key(key);
    put->set_value(value);
    pb::TxnResponse response;
    return kv_->Txn(Prepare(&context), request, &response).error_code();
  }
  grpc::StatusCode Revoke(int64_t lease) {
    grpc::ClientContext context;
    pb::LeaseRevokeRequest request;
    request.set_id(lease);
    pb::LeaseRevokeResponse response;
    return lease_->LeaseRevoke(Prepare(&context), request, &response).error_code();
  }

 private:
  grpc::ClientContext* Prepare(grpc::ClientContext* context) {
    context->set_deadline(std::chrono::system_clock::now() + 2s);
    if (!token_.empty()) context->AddMetadata("token", token_);
    return context;
  }

  std::unique_ptr<pb::KV::Stub> kv_;
  std::unique_ptr<pb::Lease::Stub> lease_;
  std::string token_;
};

class EtcdSecureTest : public ::testing::Test {
 protected:
  // One set of certificates for the suite: the cluster CA, etcd's (localhost, 127.0.0.1),
  // root's and the nodes'; node-x has a certificate but no etcd user; other/ is a second
  // CA with its own node-a.
  static void SetUpTestSuite() {
    certs_ = ff::testing::MakeTestCerts(FF_CERTS, {"DIR ca", "-i 127.0.0.1 DIR node localhost",
                                                   "DIR node root node-a node-b node-c node-x",
                                                   "DIR/other ca", "DIR/other node node-a"});
    ASSERT_NE(certs_, "");
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(certs_); }

  void SetUp() override {
    ASSERT_FALSE(EtcdServer::Binary().empty())
        << "etcd is not installed (run scripts/install-deps.sh, or set FF_ETCD)";
    etcd_ = std::make_unique<EtcdServer>(EtcdServer::Tls{certs_, token_ttl_s_});
    std::string error;
    ASSERT_TRUE(etcd_->Start(&error)) << error;
    ASSERT_EQ(etcd_->Admin(kAuth + " enable"), 0);
    ASSERT_EQ(etcd_->Admin("printf \"pw-a\\npw-b\\n\" | " + kAuth + " -s node node-a node-b"), 0);
    ASSERT_EQ(etcd_->Admin(kAuth + " node node-c"), 0);
    options_.lease_ttl = 2000ms;
    options_.backoff_min = 20ms;
    options_.backoff_max = 300ms;
    options_.rpc_timeout = 1000ms;
  }

  static std::string File(const std::string& name) { return certs_ + "/" + name; }

  // node's certificate, and its etcd user when a password is given.
  static EtcdSecurity As(const std::string& node, const std::string& password = "") {
    return {File("ca.crt"), File(node + ".crt"), File(node + ".key"), password.empty() ? "" : node,
            password};
  }

  std::unique_ptr<ControlPlane> Make(const Endpoint& self, const EtcdSecurity& security) {
    Options options = options_;
    options.etcd = security;
    std::string error;
    auto cp = MakeControlPlane("etcd:" + etcd_->url(), self, options, &error);
    EXPECT_NE(cp, nullptr) << error;
    return cp;
  }

  std::unique_ptr<ControlPlane> Router(const Endpoint& self, const EtcdSecurity& security,
                                       std::initializer_list<const char*> ips = {}) {
    return Started(Make(self, security), self, ips);
  }

  // Start()'s refusal for a router with `security` (it must be refused, promptly).
  std::string Refusal(const EtcdSecurity& security) {
    auto cp = Make(kA, security);
    if (!cp) return "not made";
    std::string error;
    const auto t0 = Clock::now();
    EXPECT_FALSE(cp->Start(&error));
    EXPECT_LT(Clock::now() - t0, 5s);
    EXPECT_FALSE(cp->Healthy());
    return error;
  }

  static bool Sees(const ControlPlane& cp, const char* ip, const Endpoint& where) {
    return cp.Lookup(Ip(ip)) == where;
  }

  inline static std::string certs_;
  int token_ttl_s_ = 0;
  std::unique_ptr<EtcdServer> etcd_;
  Options options_;
};

}  // namespace ff::cp
