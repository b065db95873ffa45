// The etcd control plane against a real etcd with TLS, client certificates and
// authentication on, set up as docs/control-plane.md tells an operator to: certificates from
// scripts/ff-certs.sh, users and roles from scripts/ff-etcd-auth.sh (node-a and node-b with
// passwords, node-c with its certificate's CN only). Routers with the right credentials
// work; wrong ones are refused at start with a sentence that says what is wrong; a router's
// credentials cannot change another node's keys; a rejected token is renewed.
#include <thread>

#include "etcd_secure_fixture.h"

namespace ff::cp {
namespace {

constexpr auto npos = std::string::npos;

TEST_F(EtcdSecureTest, RoutersWithTheRightCredentialsSeeEachOther) {
  auto a = Router(kA, As("node-a", "pw-a"), {"10.244.1.5"});
  auto b = Router(kB, As("node-b", "pw-b"), {"10.244.2.5"});
  auto c = Router(kC, As("node-c"), {"10.244.3.5"});  // the certificate's CN is the user
  ASSERT_TRUE(a && b && c);
  EXPECT_TRUE(
      WaitFor([&] { return Sees(*a, "10.244.2.5", kB) && Sees(*a, "10.244.3.5", kC); }, 2s));
  EXPECT_TRUE(
      WaitFor([&] { return Sees(*b, "10.244.1.5", kA) && Sees(*b, "10.244.3.5", kC); }, 2s));
  EXPECT_TRUE(
      WaitFor([&] { return Sees(*c, "10.244.1.5", kA) && Sees(*c, "10.244.2.5", kB); }, 2s));
  // Changes after the start flow too.
  b->Publish(Ip("10.244.2.6"));
  EXPECT_TRUE(WaitFor([&] { return Sees(*c, "10.244.2.6", kB); }, 1s));
  EXPECT_EQ(etcd_->Dump("/freeflow/v2/nodes/node-b/"),
            "/freeflow/v2/nodes/node-b/endpoint={\"address\":\"127.0.0.2\",\"port\":7472} leased\n"
            "/freeflow/v2/nodes/node-b/pods/10.244.2.5= leased\n"
            "/freeflow/v2/nodes/node-b/pods/10.244.2.6= leased\n");
}

TEST_F(EtcdSecureTest, WithoutAClientCertificateTheRouterIsRefused) {
  const std::string error = Refusal({File("ca.crt"), "", "", "node-a", "pw-a"});
  EXPECT_NE(error.find("etcd closed the TLS connection at the handshake"), npos) << error;
  EXPECT_NE(error.find("--etcd-cert"), npos) << error;
}

TEST_F(EtcdSecureTest, ACertificateFromAnotherCaIsRefused) {
  const std::string error =
      Refusal({File("ca.crt"), File("other/node-a.crt"), File("other/node-a.key"), "", ""});
  EXPECT_NE(error.find("etcd closed the TLS connection at the handshake"), npos) << error;
}

TEST_F(EtcdSecureTest, WithTheWrongCaTheRouterRefusesEtcd) {
  EtcdSecurity security = As("node-a", "pw-a");
  security.cacert = File("other/ca.crt");
  std::string error = Refusal(security);
  EXPECT_NE(error.find("cannot verify etcd's TLS certificate"), npos) << error;
  EXPECT_NE(error.find("certificate verify failed"), npos) << error;
  // No CA: the system's roots, which do not hold the test's CA either.
  security.cacert.clear();
  error = Refusal(security);
  EXPECT_NE(error.find("cannot verify etcd's TLS certificate"), npos) << error;
}

TEST_F(EtcdSecureTest, WithAWrongPasswordTheRouterIsRefused) {
  const std::string error = Refusal(As("node-a", "pw-b"));
  EXPECT_NE(error.find("etcd refused user \"node-a\""), npos) << error;
  EXPECT_NE(error.find("a wrong password, or no such user"), npos) << error;
}

TEST_F(EtcdSecureTest, WithoutAnEtcdUserTheRouterIsRefused) {
  // node-x's certificate is the cluster CA's, but etcd has no user node-x.
  const std::string error = Refusal(As("node-x"));
  EXPECT_NE(error.find("etcd refused"), npos) << error;
  EXPECT_NE(error.find("client certificate"), npos) << error;
  // node-c's user may write only node-c's keys: as node-a, it is refused.
  EtcdSecurity security = As("node-c");
  const std::string as_c = Refusal(security);
  EXPECT_NE(as_c.find("has no permission on this node's keys"), npos) << as_c;
  EXPECT_NE(as_c.find("/freeflow/v2/nodes/node-a/endpoint"), npos) << as_c;
}

// ff-etcd-auth.sh, run again, puts a node's permissions back to exactly its own: a role
// widened by hand is made anew, and another role given to the node's user is revoked.
TEST_F(EtcdSecureTest, TheAuthScriptLeavesANodeExactlyItsOwnKeys) {
  const std::string b_key = "/freeflow/v2/nodes/node-b/endpoint";
  ASSERT_EQ(etcd_->Admin("etcdctl role grant-permission freeflow-node-node-a readwrite "
                         "/freeflow/v2/nodes/node-b/ --prefix"),
            0);
  EXPECT_EQ(Client(*etcd_, As("node-a", "pw-a")).Put(b_key, "x"), grpc::StatusCode::OK);
  ASSERT_EQ(etcd_->Admin(kAuth + " node node-a"), 0);
  EXPECT_EQ(Client(*etcd_, As("node-a", "pw-a")).Put(b_key, "y"),
            grpc::StatusCode::PERMISSION_DENIED);
  ASSERT_EQ(etcd_->Admin("etcdctl user grant-role node-a root"), 0);
  EXPECT_EQ(Client(*etcd_, As("node-a", "pw-a")).Put(b_key, "z"), grpc::StatusCode::OK);
  ASSERT_EQ(etcd_->Admin(kAuth + " node node-a"), 0);
  Client a(*etcd_, As("node-a", "pw-a"));
  EXPECT_EQ(a.Put(b_key, "w"), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(a.Put("/freeflow/v2/nodes/node-a/endpoint", "{}"), grpc::StatusCode::OK);
  EXPECT_EQ(etcd_->Dump(b_key), b_key + "=z unleased\n");
  // No node may be called root: a certificate with CN root is etcd's root user.
  EXPECT_EQ(etcd_->Admin(kAuth + " node root"), 2);
}

// node-a's certificate and password (and node-c's certificate) write their own node's keys
// and nothing else: every change to node-b's keys is refused by etcd and node-b's keys stay
// as they were. An address node-b serves stays node-b's when node-a announces it too.
TEST_F(EtcdSecureTest, ARoutersCredentialsCannotChangeAnotherNodesKeys) {
  auto b = Router(kB, As("node-b", "pw-b"), {"10.244.2.5"});
  auto c = Router(kC, As("node-c"));
  ASSERT_TRUE(b && c);
  ASSERT_TRUE(WaitFor([&] { return Sees(*c, "10.244.2.5", kB); }, 2s));
  const std::string dir = "/freeflow/v2/nodes/node-b/";
  const std::string before = etcd_->Dump(dir);
  ASSERT_NE(before, "");
  const int64_t lease = etcd_->LeaseOf(dir + "endpoint");
  ASSERT_GT(lease, 0);
  const std::string evil = R"({"address":"127.0.0.66","port":7471})";
  const auto denied = grpc::StatusCode::PERMISSION_DENIED;
  for (const EtcdSecurity& who : {As("node-a", "pw-a"), As("node-c")}) {
    SCOPED_TRACE(who.cert);
    Client thief(*etcd_, who);
    EXPECT_EQ(thief.Put(dir + "endpoint", evil), denied);
    EXPECT_EQ(thief.Put(dir + "pods/10.244.2.9", ""), denied);
    EXPECT_EQ(thief.TxnPut(dir + "endpoint", evil), denied);
    EXPECT_EQ(thief.Delete(dir + "pods/10.244.2.5"), denied);
    EXPECT_EQ(thief.Delete("/freeflow/v2/", "/freeflow/v20"), denied);
    EXPECT_EQ(thief.Revoke(lease), denied);
    EXPECT_EQ(thief.Put("/freeflow/v2/nodes/node-b", evil), denied);  // beside the prefixes
    EXPECT_EQ(thief.Put("/freeflow/v2/other", evil), denied);
  }
  // The same credentials do write their own node's keys.
  Client a(*etcd_, As("node-a", "pw-a"));
  EXPECT_EQ(a.Put("/freeflow/v2/nodes/node-a/pods/10.244.1.9", ""), grpc::StatusCode::OK);
  EXPECT_EQ(a.Delete("/freeflow/v2/nodes/node-a/pods/10.244.1.9"), grpc::StatusCode::OK);
  EXPECT_EQ(etcd_->Dump(dir), before);
  EXPECT_EQ(etcd_->LeaseOf(dir + "endpoint"), lease);
  // What node-a may do, announce node-b's address as its own, does not take it over.
  auto a_router = Router(kA, As("node-a", "pw-a"), {"10.244.2.5"});
  ASSERT_TRUE(a_router);
  ASSERT_TRUE(WaitFor(
      [&] { return etcd_->Dump("/freeflow/v2/nodes/node-a/pods/").find("10.244.2.5") != npos; },
      2s));
  std::this_thread::sleep_for(200ms);
  EXPECT_TRUE(Sees(*c, "10.244.2.5", kB));
  EXPECT_TRUE(b->Healthy());
}

}  // namespace
}  // namespace ff::cp
