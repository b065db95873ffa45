#include "etcd_session.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

namespace ff::cp {
namespace {

namespace pb = etcdserverpb;
using std::chrono::milliseconds;

bool Contains(const grpc::Status& status, std::string_view text) {
  return status.error_message().find(text) != std::string::npos;
}

std::shared_ptr<grpc::Channel> MakeChannel(const EtcdConnection& connection,
                                           const std::string& target) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);  // a Range of a large cluster may exceed 4 MiB
  if (!connection.tls)
    return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = connection.ca_pem;  // empty: gRPC's default (the system's) roots
  ssl.pem_cert_chain = connection.cert_pem;
  ssl.pem_private_key = connection.key_pem;
  return grpc::CreateCustomChannel(target, grpc::SslCredentials(ssl), args);
}

}  // namespace

bool IsTokenError(const grpc::Status& status) {
  // etcd: ErrGRPCInvalidAuthToken is UNAUTHENTICATED; ErrGRPCAuthOldRevision (a token from
  // before a change of users, roles or permissions) is INVALID_ARGUMENT.
  return status.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
         (status.error_code() == grpc::StatusCode::INVALID_ARGUMENT &&
          Contains(status, "revision of auth store is old"));
}

std::string DescribeRefusal(const grpc::Status& status, std::string_view what,
                            const EtcdConnection& connection, bool first) {
  const std::string& user = connection.user;
  const std::string who = user.empty()
                              ? "this router's client certificate (its CN is the etcd user)"
                              : fmt::format("etcd user \"{}\"", user);
  const auto code = status.error_code();
  if (code == grpc::StatusCode::PERMISSION_DENIED)
    return fmt::format(
        "etcd refused {} ({}): {} has no permission on this node's keys; give it the node's "
        "role (scripts/ff-etcd-auth.sh node NODE)",
        what, Describe(status), who);
  if (code == grpc::StatusCode::INVALID_ARGUMENT && Contains(status, "authentication failed"))
    return fmt::format("etcd refused user \"{}\" ({}): a wrong password, or no such user", user,
                       Describe(status));
  if (code == grpc::StatusCode::INVALID_ARGUMENT && Contains(status, "user name is empty"))
    return fmt::format(
        "etcd has authentication on and this router gave no credentials it accepts ({}): "
        "give --etcd-user and --etcd-password, or a client certificate (--etcd-cert, "
        "--etcd-key) when etcd runs with --client-cert-auth",
        Describe(status));
  if (code != grpc::StatusCode::UNAVAILABLE || !connection.tls || !first) return {};
  // The TLS handshake failed: gRPC tells it only in the message.
  if (Contains(status, "certificate verify failed"))
    return fmt::format(
        "cannot verify etcd's TLS certificate ({}): it is not signed by the CA in "
        "--etcd-cacert (or by a system root when none is given), or it does not name the "
        "endpoint's host or address",
        Describe(status));
  // etcd refusing the client certificate: TLS 1.3 tells the client after its side of the
  // handshake, as an alert on its first read or, when the client has already sent more, a
  // reset.
  if (Contains(status, "Endpoint read failed") || Contains(status, "Ssl handshake failed") ||
      Contains(status, "Connection reset by peer"))
    return fmt::format(
        "etcd closed the TLS connection at the handshake ({}): it did not accept this "
        "router's client certificate, or requires one and none was given (--etcd-cert, "
        "--etcd-key), or it does not speak TLS on that port",
        Describe(status));
  return {};
}

std::string Describe(const grpc::Status& status) {
  return fmt::format("{} ({})", status.error_message(), static_cast<int>(status.error_code()));
}

EtcdSession::EtcdSession(EtcdConnection connection, milliseconds rpc_timeout)
    : connection_(std::move(connection)), rpc_timeout_(rpc_timeout) {}

bool EtcdSession::Open(const std::string& target, std::string* why) {
  Close();
  target_ = target;
  refused_.clear();
  answered_ = false;
  channel_ = MakeChannel(connection_, target_);
  kv_ = pb::KV::NewStub(channel_);
  lease_ = pb::Lease::NewStub(channel_);
  watch_ = pb::Watch::NewStub(channel_);
  auth_ = pb::Auth::NewStub(channel_);
  return Authenticate(why);
}

void EtcdSession::Close() {
  kv_.reset();
  lease_.reset();
  watch_.reset();
  auth_.reset();
  channel_.reset();
  token_.clear();
}

void EtcdSession::Stop() {
  std::lock_guard lock(mu_);
  stopped_ = true;
  if (active_) active_->TryCancel();
}

EtcdSession::Call::Call(EtcdSession* session, milliseconds timeout, bool survives_stop)
    : session_(survives_stop ? nullptr : session) {
  context.set_deadline(std::chrono::system_clock::now() + timeout);
  if (!session->token_.empty()) context.AddMetadata(kTokenMetadata, session->token_);
  if (!session_) return;
  std::lock_guard lock(session_->mu_);
  if (session_->stopped_) context.TryCancel();
  session_->active_ = &context;
}

EtcdSession::Call::~Call() {
  if (!session_) return;
  std::lock_guard lock(session_->mu_);
  session_->active_ = nullptr;
}

bool EtcdSession::Failed(const grpc::Status& status, std::string_view what, std::string* why) {
  refused_ = DescribeRefusal(status, what, connection_, !answered_);
  *why = refused_.empty() ? fmt::format("{}: {}", what, Describe(status)) : refused_;
  return false;
}

bool EtcdSession::Authenticate(std::string* why, bool survives_stop) {
  token_.clear();
  if (connection_.user.empty()) return true;
  pb::AuthenticateRequest request;
  request.set_name(connection_.user);
  request.set_password(connection_.password);
  pb::AuthenticateResponse response;
  Call call(this, rpc_timeout_, survives_stop);
  const auto status = auth_->Authenticate(&call.context, request, &response);
  if (status.ok()) {
    token_ = response.token();
    return answered_ = true;
  }
  if (status.error_code() != grpc::StatusCode::FAILED_PRECONDITION)
    return Failed(status, "Authenticate", why);
  spdlog::warn(
      "control plane: etcd at {} has authentication off ({}): anyone who reaches it can "
      "change where pods live; going on without a token",
      target_, Describe(status));
  return true;
}

bool EtcdSession::TokenRejected(const grpc::Status& status, std::string_view what) {
  if (token_.empty() || !IsTokenError(status)) return false;
  spdlog::info(
      "control plane: etcd rejected the token of user \"{}\" on {} ({}); authenticating again",
      connection_.user, what, Describe(status));
  return true;
}

bool EtcdSession::KeepAlive(int64_t lease, milliseconds timeout, int64_t* ttl, std::string* why) {
  for (bool retried = false;; retried = true) {
    Call call(this, timeout);
    auto stream = lease_->LeaseKeepAlive(&call.context);
    pb::LeaseKeepAliveRequest request;
    request.set_id(lease);
    pb::LeaseKeepAliveResponse response;
    const bool ok = stream->Write(request) && stream->Read(&response);
    stream->WritesDone();
    const auto status = stream->Finish();
    if (ok) {
      *ttl = response.ttl();
      return answered_ = true;
    }
    if (status.ok()) {
      *why = "LeaseKeepAlive: no answer";
      return false;
    }
    if (retried || !TokenRejected(status, "LeaseKeepAlive"))
      return Failed(status, "LeaseKeepAlive", why);
    if (!Authenticate(why)) return false;
  }
}

grpc::Status EtcdSession::Revoke(int64_t lease, milliseconds timeout) {
  pb::LeaseRevokeRequest request;
  request.set_id(lease);
  pb::LeaseRevokeResponse response;
  std::string why;
  for (bool retried = false;; retried = true) {  // a token idle for long may have expired
    Call call(this, timeout, /*survives_stop=*/true);
    const auto status = lease_->LeaseRevoke(&call.context, request, &response);
    if (status.ok() || retried || !TokenRejected(status, "LeaseRevoke") ||
        !Authenticate(&why, /*survives_stop=*/true))
      return status;
  }
}

std::unique_ptr<grpc::ClientContext> EtcdSession::WatchContext() const {
  auto context = std::make_unique<grpc::ClientContext>();
  if (!token_.empty()) context->AddMetadata(kTokenMetadata, token_);
  return context;
}

}  // namespace ff::cp
