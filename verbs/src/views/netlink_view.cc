#include "views/netlink_view.h"

#include <endian.h>
#include <linux/netlink.h>
#include <rdma/rdma_netlink.h>

#include <cerrno>
#include <cstring>

namespace ff::verbs {
namespace {

constexpr int kCopyOnFork = 1;      // the library's fork (docs/verbs-library.md "fork")
constexpr int kNetnsExclusive = 0;  // a pod sees its own device only

// One netlink message being written: a header, then attributes, each padded to 4 bytes.
class Message {
 public:
  Message(uint16_t type, uint16_t flags, uint32_t seq, uint32_t portid) {
    nlmsghdr h{};
    h.nlmsg_type = type;
    h.nlmsg_flags = flags;
    h.nlmsg_seq = seq;
    h.nlmsg_pid = portid;
    Put(&h, sizeof(h));
  }
  void U8(uint16_t type, uint8_t v) { Attr(type, &v, sizeof(v)); }
  void U32(uint16_t type, uint32_t v) { Attr(type, &v, sizeof(v)); }
  void U64(uint16_t type, uint64_t v) { Attr(type, &v, sizeof(v)); }
  void Str(uint16_t type, const std::string& v) { Attr(type, v.c_str(), v.size() + 1); }
  void Raw(const void* data, size_t len) { Put(data, len); }
  std::string Done() {
    const auto len = static_cast<uint32_t>(buf_.size());
    std::memcpy(buf_.data(), &len, sizeof(len));  // nlmsg_len is the header's first field
    return std::move(buf_);
  }

 private:
  void Put(const void* data, size_t len) {
    buf_.append(static_cast<const char*>(data), len);
    buf_.append(NLMSG_ALIGN(len) - len, '\0');
  }
  void Attr(uint16_t type, const void* data, size_t len) {
    nlattr a{};
    a.nla_len = static_cast<uint16_t>(NLA_HDRLEN + len);
    a.nla_type = type;
    buf_.append(reinterpret_cast<const char*>(&a), sizeof(a));
    Put(data, len);
  }
  std::string buf_;
};

// What a request names: its device and port indexes, when given.
struct Request {
  const nlmsghdr* h;
  bool has_dev = false;
  uint32_t dev = 0;
  bool has_port = false;
  uint32_t port = 0;
};

// The attributes after the header; false if one overruns the message.
bool Parse(const nlmsghdr* h, Request* r) {
  r->h = h;
  const auto* p = reinterpret_cast<const uint8_t*>(h) + NLMSG_HDRLEN;
  const uint8_t* end = reinterpret_cast<const uint8_t*>(h) + h->nlmsg_len;
  while (p + NLA_HDRLEN <= end) {
    nlattr a;
    std::memcpy(&a, p, sizeof(a));
    if (a.nla_len < NLA_HDRLEN || p + a.nla_len > end) return false;
    const uint16_t type = a.nla_type & NLA_TYPE_MASK;
    uint32_t v = 0;
    if ((type == RDMA_NLDEV_ATTR_DEV_INDEX || type == RDMA_NLDEV_ATTR_PORT_INDEX) &&
        a.nla_len == NLA_HDRLEN + sizeof(v)) {
      std::memcpy(&v, p + NLA_HDRLEN, sizeof(v));
      if (type == RDMA_NLDEV_ATTR_DEV_INDEX) {
        r->has_dev = true;
        r->dev = v;
      } else {
        r->has_port = true;
        r->port = v;
      }
    }
    p += NLA_ALIGN(a.nla_len);
  }
  return true;
}

// NLMSG_ERROR: `error` (0 acknowledges), with the request's header (the kernel caps it).
std::string Error(const nlmsghdr* req, int error, uint32_t portid) {
  Message m(NLMSG_ERROR, NLM_F_CAPPED, req->nlmsg_seq, portid);
  nlmsgerr e{};
  e.error = error;
  e.msg = *req;
  m.Raw(&e, sizeof(e));
  return m.Done();
}

std::string DumpDone(const nlmsghdr* req, uint32_t portid) {
  Message m(NLMSG_DONE, NLM_F_MULTI, req->nlmsg_seq, portid);
  const int zero = 0;
  m.Raw(&zero, sizeof(zero));
  return m.Done();
}

void Identify(Message* m, const DeviceFacts& f) {
  m->U32(RDMA_NLDEV_ATTR_DEV_INDEX, static_cast<uint32_t>(f.index));
  m->Str(RDMA_NLDEV_ATTR_DEV_NAME, f.name);
}

std::string Device(const Request& r, uint16_t flags, const DeviceFacts& f, uint32_t portid) {
  Message m(RDMA_NL_GET_TYPE(RDMA_NL_NLDEV, RDMA_NLDEV_CMD_GET), flags, r.h->nlmsg_seq, portid);
  Identify(&m, f);
  m.U32(RDMA_NLDEV_ATTR_PORT_INDEX, f.device.phys_port_cnt);  // the last port
  m.U64(RDMA_NLDEV_ATTR_CAP_FLAGS, f.device.device_cap_flags);
  if (f.device.fw_ver[0] != '\0') m.Str(RDMA_NLDEV_ATTR_FW_VERSION, f.device.fw_ver);
  m.U64(RDMA_NLDEV_ATTR_NODE_GUID, be64toh(f.device.node_guid));
  m.U64(RDMA_NLDEV_ATTR_SYS_IMAGE_GUID, be64toh(f.device.sys_image_guid));
  m.U8(RDMA_NLDEV_ATTR_DEV_NODE_TYPE, RDMA_NODE_IB_CA);
  m.U8(RDMA_NLDEV_ATTR_DEV_DIM, 0);
  if (f.port.link_layer == IBV_LINK_LAYER_ETHERNET) m.Str(RDMA_NLDEV_ATTR_DEV_PROTOCOL, "roce");
  return m.Done();
}

// A RoCE port, as the kernel fills it: no LID, SM or capability attributes (those are
// InfiniBand's), the netdev when it is in the asker's namespace (it always is: it is the
// pod's own interface).
std::string Port(const Request& r, uint16_t flags, const DeviceFacts& f, uint32_t portid) {
  Message m(RDMA_NL_GET_TYPE(RDMA_NL_NLDEV, RDMA_NLDEV_CMD_PORT_GET), flags, r.h->nlmsg_seq,
            portid);
  Identify(&m, f);
  m.U32(RDMA_NLDEV_ATTR_PORT_INDEX, 1);
  m.U8(RDMA_NLDEV_ATTR_PORT_STATE, static_cast<uint8_t>(f.port.state));
  m.U8(RDMA_NLDEV_ATTR_PORT_PHYS_STATE, f.port.phys_state);
  if (!f.netdev.empty()) {
    m.U32(RDMA_NLDEV_ATTR_NDEV_INDEX, f.netdev_index);
    m.Str(RDMA_NLDEV_ATTR_NDEV_NAME, f.netdev);
  }
  return m.Done();
}

std::string System(const Request& r, uint32_t portid) {
  Message m(RDMA_NL_GET_TYPE(RDMA_NL_NLDEV, RDMA_NLDEV_CMD_SYS_GET), 0, r.h->nlmsg_seq, portid);
  m.U8(RDMA_NLDEV_SYS_ATTR_NETNS_MODE, kNetnsExclusive);
  m.U8(RDMA_NLDEV_SYS_ATTR_COPY_ON_FORK, kCopyOnFork);
  return m.Done();
}

// The answer to one request: its messages, then (a dump) DONE or (otherwise) the
// acknowledgement it asked for; an error instead of both.
void Answer(const Request& r, const DeviceFacts* f, uint32_t portid,
            std::vector<std::string>* out) {
  const nlmsghdr* h = r.h;
  const bool dump = (h->nlmsg_flags & NLM_F_DUMP) == NLM_F_DUMP;
  const bool ack = (h->nlmsg_flags & NLM_F_ACK) != 0;
  if (RDMA_NL_GET_CLIENT(h->nlmsg_type) != RDMA_NL_NLDEV) {
    out->push_back(Error(h, -EINVAL, portid));  // no other RDMA netlink client exists here
    return;
  }
  const bool ours = f != nullptr && r.has_dev && r.dev == static_cast<uint32_t>(f->index);
  std::string reply;
  int error = 0;
  switch (RDMA_NL_GET_OP(h->nlmsg_type)) {
    case RDMA_NLDEV_CMD_GET:
      if (dump) {
        if (f != nullptr) out->push_back(Device(r, NLM_F_MULTI, *f, portid));
        out->push_back(DumpDone(h, portid));
        return;
      }
      error = ours ? 0 : -EINVAL;
      if (ours) reply = Device(r, 0, *f, portid);
      break;
    case RDMA_NLDEV_CMD_PORT_GET:
      if (dump) {
        if (!r.has_dev || (f != nullptr && !ours)) {
          error = -EINVAL;  // the kernel dumps the ports of one named device
          break;
        }
        if (f != nullptr) out->push_back(Port(r, NLM_F_MULTI, *f, portid));
        out->push_back(DumpDone(h, portid));
        return;
      }
      error = ours && r.has_port && r.port == 1 ? 0 : -EINVAL;
      if (error == 0) reply = Port(r, 0, *f, portid);
      break;
    case RDMA_NLDEV_CMD_SYS_GET:
      reply = System(r, portid);
      break;
    default:
      error = -EOPNOTSUPP;
  }
  if (error != 0) {
    out->push_back(Error(h, error, portid));
    return;
  }
  out->push_back(std::move(reply));
  if (ack) out->push_back(Error(h, 0, portid));
}

}  // namespace

std::vector<std::string> AnswerNetlink(const DeviceFacts* facts, const void* request, size_t len,
                                       uint32_t portid) {
  std::vector<std::string> out;
  auto* h = static_cast<const nlmsghdr*>(request);
  int left = len > 65536 ? 65536 : static_cast<int>(len);
  for (; NLMSG_OK(h, left); h = NLMSG_NEXT(h, left)) {
    if (h->nlmsg_type < NLMSG_MIN_TYPE || (h->nlmsg_flags & NLM_F_REQUEST) == 0) continue;
    Request r;
    if (!Parse(h, &r)) {
      out.push_back(Error(h, -EINVAL, portid));
      continue;
    }
    Answer(r, facts, portid, &out);
  }
  return out;
}

}  // namespace ff::verbs
