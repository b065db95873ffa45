#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "freeflow/controlplane.h"

namespace ff::cp {
namespace {

const Endpoint kSelf{"node-a", 0xac1f0002, 7471};

std::string ErrorFor(const std::string& spec, const Options& options = {},
                     const Endpoint& self = kSelf) {
  std::string error;
  auto cp = MakeControlPlane(spec, self, options, &error);
  EXPECT_EQ(cp, nullptr) << spec;
  return error;
}

TEST(SpecTest, RejectsUnknownKinds) {
  EXPECT_NE(ErrorFor("consul:foo").find("must be static:FILE or etcd:URL"), std::string::npos);
  EXPECT_NE(ErrorFor("").find("must be static:FILE"), std::string::npos);
  EXPECT_NE(ErrorFor("static:").find("names no file"), std::string::npos);
  EXPECT_NE(ErrorFor("etcd:").find("names no endpoint"), std::string::npos);
}

TEST(SpecTest, RejectsMalformedEtcdEndpoints) {
  EXPECT_NE(ErrorFor("etcd:https://127.0.0.1:2379,http://127.0.0.1:2380").find("mix http://"),
            std::string::npos);
  EXPECT_NE(ErrorFor("etcd:127.0.0.1").find("\"127.0.0.1\" is not of the form"), std::string::npos);
  EXPECT_NE(ErrorFor("etcd:http://127.0.0.1:2379,http://x/y:1").find("\"http://x/y:1\""),
            std::string::npos);
  EXPECT_NE(ErrorFor("etcd:127.0.0.1:99999").find("not in 1-65535"), std::string::npos);
}

TEST(SpecTest, RejectsBadOptionsAndSelf) {
  Options o;
  o.backoff_min = std::chrono::milliseconds(500);
  o.backoff_max = std::chrono::milliseconds(100);
  EXPECT_NE(ErrorFor("static:/x.json", o).find("backoff"), std::string::npos);
  EXPECT_NE(ErrorFor("static:/x.json", {}, Endpoint{"", 1, 1}).find("node name"),
            std::string::npos);
  EXPECT_NE(ErrorFor("static:/x.json", {}, Endpoint{"a/b", 1, 1}).find("node name"),
            std::string::npos);
}

TEST(SpecTest, StaticStartNamesTheMissingFile) {
  std::string error;
  auto cp = MakeControlPlane("static:/nonexistent/ff-nodes.json", kSelf, {}, &error);
  ASSERT_NE(cp, nullptr) << error;
  EXPECT_FALSE(cp->Start(&error));
  EXPECT_NE(error.find("/nonexistent/ff-nodes.json"), std::string::npos) << error;
  EXPECT_FALSE(cp->Healthy());
}

TEST(SpecTest, AcceptsEtcdEndpointForms) {
  std::string error;
  EXPECT_NE(MakeControlPlane("etcd:http://127.0.0.1:2379", kSelf, {}, &error), nullptr) << error;
  EXPECT_NE(MakeControlPlane("etcd:127.0.0.1:2379, http://localhost:2379/", kSelf, {}, &error),
            nullptr)
      << error;
  EXPECT_NE(MakeControlPlane("etcd:https://etcd.example:2379", kSelf, {}, &error), nullptr)
      << error;
}

// A port on 127.0.0.1 that refuses connections: bound but never listened on.
class RefusingPort {
 public:
  RefusingPort() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
  }
  ~RefusingPort() { ::close(fd_); }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

TEST(EtcdWithoutServerTest, ServesLocalAddressesAndStopsPromptly) {
  RefusingPort refusing;
  Options options;
  options.backoff_min = std::chrono::milliseconds(10);
  options.backoff_max = std::chrono::milliseconds(50);
  std::string error;
  auto cp =
      MakeControlPlane("etcd:127.0.0.1:" + std::to_string(refusing.port()), kSelf, options, &error);
  ASSERT_NE(cp, nullptr) << error;
  cp->Publish(0x0af40105);
  ASSERT_TRUE(cp->Start(&error)) << error;
  std::string again;
  EXPECT_FALSE(cp->Start(&again));
  cp->Publish(0x0af40106);
  std::this_thread::sleep_for(std::chrono::milliseconds(150));  // several failed attempts
  EXPECT_FALSE(cp->Healthy());
  EXPECT_EQ(cp->Lookup(0x0af40105), kSelf);
  EXPECT_EQ(cp->Lookup(0x0af40106), kSelf);
  EXPECT_EQ(cp->Lookup(0x0af40107), std::nullopt);
  EXPECT_TRUE(cp->Nodes().empty());
  const auto t0 = std::chrono::steady_clock::now();
  cp.reset();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(500));
}

}  // namespace
}  // namespace ff::cp
