#include "base/handover_state.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>

namespace ff::router {
namespace {

struct Wire {
  uint32_t magic;
  HandoverType type;
  uint64_t a;
  uint64_t b;
};
static_assert(sizeof(Wire) == 24);

constexpr size_t kFdsPerMessage = 16;  // RecvWithFds takes up to 16 a message
constexpr size_t kPieceBytes = 60 * 1024;
constexpr size_t kMessageMax = sizeof(Wire) + kPieceBytes;

int SendOne(int sock, HandoverType type, uint64_t a, uint64_t b, const void* payload, size_t n,
            const int* fds = nullptr, int nfds = 0) {
  std::string buf(sizeof(Wire) + n, '\0');
  const Wire w{kHandoverMagic, type, a, b};
  std::memcpy(buf.data(), &w, sizeof(w));
  if (n != 0) std::memcpy(buf.data() + sizeof(w), payload, n);
  return SendWithFds(sock, buf.data(), buf.size(), fds, nfds, MSG_NOSIGNAL);
}

// Receives one message into *buf: 0 (with its header in *w), ENODATA at the end, EPROTO.
int ReceiveOne(int sock, Wire* w, std::string* buf, UniqueFd* fds, int* nfds) {
  buf->resize(kMessageMax);
  size_t n = 0;
  UniqueFd none[kFdsPerMessage];
  if (fds == nullptr) fds = none;
  if (const int rc = RecvWithFds(sock, buf->data(), buf->size(), fds, kFdsPerMessage, nfds, &n))
    return rc;
  if (n == 0) return ENODATA;
  if (n < sizeof(Wire)) return EPROTO;
  std::memcpy(w, buf->data(), sizeof(Wire));
  if (w->magic != kHandoverMagic) return EPROTO;
  buf->erase(0, sizeof(Wire));
  buf->resize(n - sizeof(Wire));
  if (fds == none && *nfds != 0) return EPROTO;  // descriptors where none belong
  return 0;
}

bool IsControl(HandoverType t) {
  switch (t) {
    case HandoverType::kHello:
    case HandoverType::kRefuse:
    case HandoverType::kAccept:
    case HandoverType::kServing:
    case HandoverType::kFailed:
      return true;
    default:
      return false;
  }
}

}  // namespace

uint32_t HandoverState::PutFd(int fd) {
  out_fds_.push_back(fd);
  return static_cast<uint32_t>(out_fds_.size() - 1);
}

uint32_t HandoverState::PutFd(UniqueFd fd) {
  owned_.push_back(std::move(fd));
  return PutFd(owned_.back().get());
}

UniqueFd MappedFile(const Mapping& m, int flags) {
  const auto start = reinterpret_cast<uintptr_t>(m.get());
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t end = start + (m.size() + page - 1) / page * page;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/self/map_files/%lx-%lx",
                static_cast<unsigned long>(start), static_cast<unsigned long>(end));
  UniqueFd fd(::open(path, flags | O_CLOEXEC));
  if (!fd)
    throw HandoverError(std::string("a mapped segment cannot be reopened: ") +
                        std::strerror(errno));
  return fd;
}

UniqueFd HandoverState::TakeFd(const Json& index, FdKind kind) {
  if (!index.is_number_unsigned() || index.get<uint64_t>() >= in_fds_.size())
    throw HandoverError("a record names a descriptor the state does not hold");
  const auto i = index.get<size_t>();
  if (taken_[i]) throw HandoverError("two records name descriptor " + std::to_string(i));
  struct stat st {};
  if (::fstat(in_fds_[i].get(), &st) != 0)
    throw HandoverError("descriptor " + std::to_string(i) + " cannot be examined");
  // memfds are regular files of the tmpfs behind memfd_create; sockets are sockets.
  if ((kind == FdKind::kSocket && !S_ISSOCK(st.st_mode)) ||
      (kind == FdKind::kMemfd && !S_ISREG(st.st_mode)))
    throw HandoverError("descriptor " + std::to_string(i) + " is not of the kind its record says");
  taken_[i] = true;
  return std::move(in_fds_[i]);
}

size_t HandoverState::untaken() const {
  return static_cast<size_t>(std::count(taken_.begin(), taken_.end(), false));
}

uint64_t HandoverState::U64(const Json& j, const char* key, uint64_t max) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_number_unsigned())
    throw HandoverError(std::string("field '") + key + "' is missing or not a count");
  const auto v = it->get<uint64_t>();
  if (v > max) throw HandoverError(std::string("field '") + key + "' is out of range");
  return v;
}

uint64_t HandoverState::At(const Json& a, size_t i, uint64_t max) {
  if (!a.is_array() || i >= a.size() || !a[i].is_number_unsigned() || a[i].get<uint64_t>() > max)
    throw HandoverError("element " + std::to_string(i) + " of a list is missing or out of range");
  return a[i].get<uint64_t>();
}

bool HandoverState::Bool(const Json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_boolean())
    throw HandoverError(std::string("field '") + key + "' is missing or not a truth value");
  return it->get<bool>();
}

const HandoverState::Json& HandoverState::Array(const Json& j, const char* key, size_t max) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_array() || it->size() > max)
    throw HandoverError(std::string("field '") + key + "' is missing, not a list or too long");
  return *it;
}

const HandoverState::Json& HandoverState::Object(const Json& j, const char* key) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_object())
    throw HandoverError(std::string("field '") + key + "' is missing or not a record");
  return *it;
}

std::string HandoverState::Bytes(const Json& j, const char* key, size_t max) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_binary() || it->get_binary().size() > max)
    throw HandoverError(std::string("field '") + key + "' is missing, not bytes or too long");
  const auto& b = it->get_binary();
  return std::string(b.begin(), b.end());
}

std::string HandoverState::Text(const Json& j, const char* key, size_t max) {
  const auto it = j.find(key);
  if (it == j.end() || !it->is_string() || it->get_ref<const std::string&>().size() > max)
    throw HandoverError(std::string("field '") + key + "' is missing, not text or too long");
  return it->get<std::string>();
}

int HandoverState::Send(int sock) const {
  for (size_t i = 0; i < out_fds_.size(); i += kFdsPerMessage) {
    const size_t n = std::min(kFdsPerMessage, out_fds_.size() - i);
    if (const int rc = SendOne(sock, HandoverType::kFds, n, 0, nullptr, 0, out_fds_.data() + i,
                               static_cast<int>(n)))
      return rc;
  }
  const std::vector<uint8_t> bytes = Json::to_cbor(doc);
  for (size_t at = 0; at < bytes.size(); at += kPieceBytes) {
    const size_t n = std::min(kPieceBytes, bytes.size() - at);
    if (const int rc = SendOne(sock, HandoverType::kState, n, 0, bytes.data() + at, n)) return rc;
  }
  return SendOne(sock, HandoverType::kEnd, out_fds_.size(), bytes.size(), nullptr, 0);
}

int HandoverState::Receive(int sock, size_t max_fds, size_t max_bytes, std::string* why) {
  std::string bytes, buf;
  for (;;) {
    Wire w{};
    UniqueFd fds[kFdsPerMessage];
    int nfds = 0;
    if (const int rc = ReceiveOne(sock, &w, &buf, fds, &nfds)) {
      *why = rc == ENODATA ? "the old router closed the hand-over before its end"
                           : std::string("receiving the state: ") + std::strerror(rc);
      return rc;
    }
    if (w.type == HandoverType::kEnd) {
      if (w.a != in_fds_.size() || w.b != bytes.size() || nfds != 0) {
        *why = "the state's end does not match what came";
        return EPROTO;
      }
      break;
    }
    const bool fds_ok = w.type == HandoverType::kFds
                            ? w.a == static_cast<uint64_t>(nfds) && buf.empty()
                            : nfds == 0;
    if (!fds_ok || (w.type != HandoverType::kFds && w.type != HandoverType::kState)) {
      *why = "an unexpected message in the state";
      return EPROTO;
    }
    if (in_fds_.size() + nfds > max_fds || bytes.size() + buf.size() > max_bytes) {
      *why = "the state is larger than this router takes";
      return E2BIG;
    }
    for (int i = 0; i < nfds; ++i) in_fds_.push_back(std::move(fds[i]));
    bytes += buf;
  }
  taken_.assign(in_fds_.size(), false);
  doc = Json::from_cbor(bytes, true, false);
  if (doc.is_discarded() || !doc.is_object()) {
    *why = "the state is not a well-formed document";
    return EPROTO;
  }
  return 0;
}

int SendHandoverMessage(int sock, const HandoverMessage& m) {
  const size_t n = std::min(m.text.size(), kHandoverTextMax);
  return SendOne(sock, m.type, m.a, m.b, m.text.data(), n);
}

int ReceiveHandoverMessage(int sock, HandoverMessage* m) {
  Wire w{};
  std::string buf;
  int nfds = 0;
  if (const int rc = ReceiveOne(sock, &w, &buf, nullptr, &nfds)) return rc;
  if (!IsControl(w.type) || buf.size() > kHandoverTextMax) return EPROTO;
  m->type = w.type;
  m->a = w.a;
  m->b = w.b;
  m->text = std::move(buf);
  return 0;
}

}  // namespace ff::router
