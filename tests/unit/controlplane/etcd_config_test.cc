// The etcd security options as MakeControlPlane checks them (etcd_config.h): which
// endpoints speak TLS, and every misconfiguration refused with a sentence naming the flag
// or file at fault. Certificates come from scripts/ff-certs.sh in a temporary directory.
#include "etcd_config.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "test_certs.h"

namespace ff::cp {
namespace {

namespace fs = std::filesystem;

class EtcdConfigTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = ff::testing::MakeTestCerts(FF_CERTS, {"DIR ca", "DIR node node-a node-b"});
    ASSERT_NE(dir_, "");
    std::ofstream(dir_ + "/text.pem") << "not a certificate\n";
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  static std::string File(const std::string& name) { return dir_ + "/" + name; }

  // The error for `list` with `security`; "" when accepted (then *connection is filled).
  static std::string Check(const std::string& list, const EtcdSecurity& security,
                           EtcdConnection* connection = nullptr) {
    EtcdConnection scratch;
    std::string error;
    const bool ok = MakeEtcdConnection(list, security, connection ? connection : &scratch, &error);
    EXPECT_EQ(ok, error.empty()) << error;
    return error;
  }

  static bool Has(const std::string& text, const std::string& part) {
    return text.find(part) != std::string::npos;
  }

  static EtcdSecurity ClientA() {
    return {File("ca.crt"), File("node-a.crt"), File("node-a.key"), "", ""};
  }

  static std::string dir_;
};

std::string EtcdConfigTest::dir_;

TEST_F(EtcdConfigTest, HttpsAndSchemelessEndpointsSpeakTls) {
  EtcdConnection c;
  EXPECT_EQ(Check("https://10.0.0.5:2379, https://10.0.0.6:2379", {}, &c), "");
  EXPECT_TRUE(c.tls);
  EXPECT_EQ(c.targets, (std::vector<std::string>{"10.0.0.5:2379", "10.0.0.6:2379"}));
  EXPECT_TRUE(c.ca_pem.empty());  // the system's roots
  EXPECT_EQ(Check("10.0.0.5:2379", ClientA(), &c), "");
  EXPECT_TRUE(c.tls);
  EXPECT_TRUE(Has(c.ca_pem, "BEGIN CERTIFICATE") && Has(c.cert_pem, "BEGIN CERTIFICATE") &&
              Has(c.key_pem, "PRIVATE KEY"));
  EXPECT_EQ(Check("10.0.0.5:2379,http://10.0.0.6:2379", {}, &c), "");
  EXPECT_FALSE(c.tls);
}

TEST_F(EtcdConfigTest, PlaintextWithTlsFilesIsRefused) {
  const std::string error = Check("http://10.0.0.5:2379", ClientA());
  EXPECT_TRUE(Has(error, "\"http://10.0.0.5:2379\" is plaintext") && Has(error, "https://"))
      << error;
  EXPECT_NE(Check("http://10.0.0.5:2379", {File("ca.crt"), "", "", "", ""}), "");
  EXPECT_TRUE(Has(Check("https://a:1,http://b:2", {}), "mix http:// and https://"));
}

TEST_F(EtcdConfigTest, ACertificateWithoutItsKeyIsRefused) {
  EXPECT_TRUE(Has(Check("https://a:1", {"", File("node-a.crt"), "", "", ""}),
                  "certificate is given (--etcd-cert or ETCDCTL_CERT) without its key"));
  EXPECT_TRUE(Has(Check("https://a:1", {"", "", File("node-a.key"), "", ""}),
                  "key is given (--etcd-key or ETCDCTL_KEY) without its certificate"));
}

TEST_F(EtcdConfigTest, UnreadableOrWrongFilesAreNamed) {
  EtcdSecurity s = ClientA();
  s.cacert = File("missing.crt");
  EXPECT_TRUE(Has(Check("https://a:1", s), "cannot read etcd CA (--etcd-cacert) file " +
                                               File("missing.crt") + ": No such file"));
  s = ClientA();
  s.cert = dir_;  // a directory
  EXPECT_TRUE(Has(Check("https://a:1", s), "file " + dir_ + ": Is a directory"));
  s = ClientA();
  s.key = File("text.pem");
  EXPECT_TRUE(Has(Check("https://a:1", s), File("text.pem") + " is not a PEM file"));
  s = ClientA();
  s.cacert = File("node-a.key");  // PEM, but no certificate in it
  EXPECT_TRUE(Has(Check("https://a:1", s), File("node-a.key") + " holds no certificate"));
  s = ClientA();
  s.key = File("node-b.key");  // another node's key
  const std::string error = Check("https://a:1", s);
  EXPECT_TRUE(Has(
      error, File("node-b.key") + " does not belong to the certificate in " + File("node-a.crt")))
      << error;
}

TEST_F(EtcdConfigTest, UserAndPasswordComeTogether) {
  EtcdConnection c;
  EXPECT_EQ(Check("https://a:1", {"", "", "", "node-a", "secret"}, &c), "");
  EXPECT_EQ(c.user, "node-a");
  EXPECT_EQ(c.password, "secret");
  EXPECT_TRUE(Has(Check("https://a:1", {"", "", "", "node-a", ""}),
                  "etcd user \"node-a\" has no password"));
  EXPECT_TRUE(Has(Check("https://a:1", {"", "", "", "", "secret"}),
                  "password is given (--etcd-password or ETCDCTL_PASSWORD) without a user"));
  // Over plaintext: allowed, with a warning in the log.
  EXPECT_EQ(Check("http://a:1", {"", "", "", "node-a", "secret"}), "");
}

}  // namespace
}  // namespace ff::cp
