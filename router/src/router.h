// The per-node freeflow router: the broker that introduces pods to each other.
//
// It owns no data path on one node. It identifies every client by its network namespace,
// assigns QP numbers and memory keys, publishes each context's MR table, and hands the
// shared-memory segments of a QP (and the memfds behind remote-accessible memory) to the
// peers that connect to it. When a client goes away everything it held is released and
// its peers are told. Single-threaded: one epoll loop, non-blocking SOCK_SEQPACKET
// sockets, so one slow or hostile client cannot stall another.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "freeflow/fd.h"
#include "freeflow/ipv4.h"
#include "freeflow/protocol.h"
#include "freeflow/shm_layout.h"
#include "identity.h"

namespace ff::router {

struct RouterConfig {
  std::string dir = "/freeflow";
  std::string name = "ffrouter";
  Ipv4Prefix overlay;
  std::string library_source;  // copied to <dir>/libffverbs.so at start; empty: skip
  std::string node_name;
};

class Router {
 public:
  Router(RouterConfig config, std::unique_ptr<IdentityResolver> identity);
  ~Router();

  // Takes the lock, installs the library and listens. Returns false with *error set to a
  // message a person can act on (bad dir, second router, ...).
  bool Start(std::string* error);
  // Serves until Stop() is called (from a signal handler or another thread).
  void Run();
  void Stop();

  std::string socket_path() const;
  size_t session_count() const { return sessions_.size(); }

 private:
  struct Region {
    UniqueFd fd;
    uint64_t size = 0;
  };
  struct Cq {
    uint32_t notify_slot = proto::kNoId;
    uint32_t chan_id = proto::kNoId;
  };
  struct Session {
    uint32_t id = 0;
    UniqueFd sock;
    UniqueFd events;
    PodIdentity who;
    bool hello = false;
    std::string refusal;  // set when the client is not a pod of the overlay
    UniqueFd notify_seg;
    UniqueFd mr_table_fd;     // read-write, router only
    UniqueFd mr_table_ro_fd;  // what the owner and peers get
    Mapping mr_table;
    std::vector<uint8_t> slot_tags;
    std::vector<uint32_t> free_slots;
    std::map<uint32_t, UniqueFd> channels;
    std::map<uint32_t, Cq> cqs;
    std::map<uint32_t, UniqueFd> srqs;
    std::map<uint32_t, Region> regions;
    std::set<uint32_t> qps;
  };
  struct Qp {
    uint32_t qpn = 0;
    uint32_t type = 0;
    uint32_t owner = 0;  // session id
    UniqueFd seg;
    uint32_t num_rings = 0;
    uint32_t ring_bytes = 0;
    uint32_t srq_id = proto::kNoId;
    uint32_t recv_cq_id = proto::kNoId;
    std::vector<uint32_t> ring_producer;  // qpn producing into each ring, 0 = free
    std::set<uint32_t> produces_into;     // QPs whose rings this QP produces into
  };

  void Accept();
  void HandleReadable(Session& s);
  // Returns false when the session must be dropped (protocol violation or I/O error).
  bool Dispatch(Session& s, const char* buf, size_t len, UniqueFd* fds, int nfds);
  bool Reply(Session& s, const proto::Response& r, const int* fds = nullptr, int nfds = 0);
  void Drop(uint32_t session_id, const char* why);
  void ReleaseQp(Qp& qp, bool process_died);
  void Notify(uint32_t session_id, proto::EventType type, uint32_t qpn);
  Session* FindSession(uint32_t id);
  Qp* FindDest(uint32_t dest_ip, uint16_t dest_lid, uint32_t dest_qpn);
  bool FillConnectReply(Session& s, Qp& dest, uint32_t ring, proto::Response* r,
                        std::vector<int>* fds);
  bool InstallLibrary(std::string* error);

  int OnHello(Session& s, const proto::Hello& m, UniqueFd* fds, int nfds, proto::Response* r,
              std::vector<int>* out_fds);
  int OnCreateQp(Session& s, const proto::CreateQp& m, UniqueFd* fds, int nfds, proto::Response* r);
  int OnConnect(Session& s, const proto::ConnectQp& m, bool ud, proto::Response* r,
                std::vector<int>* out_fds);
  int OnRegMr(Session& s, const proto::RegMr& m, UniqueFd* fds, int nfds, proto::Response* r);
  int OnDeregMr(Session& s, const proto::DeregMr& m);
  int OnMoveMr(Session& s, const proto::MoveMr& m, UniqueFd* fds, int nfds);
  int OnGetRegion(Session& s, const proto::GetRegion& m, proto::Response* r,
                  std::vector<int>* out_fds);

  RouterConfig config_;
  std::unique_ptr<IdentityResolver> identity_;
  UniqueFd lock_fd_;
  UniqueFd listen_fd_;
  UniqueFd epoll_fd_;
  UniqueFd stop_fd_;  // eventfd written by Stop()
  uint32_t next_session_ = 1;
  uint32_t next_qpn_ = 0x100;
  std::unordered_map<uint32_t, std::unique_ptr<Session>> sessions_;
  std::unordered_map<uint32_t, std::unique_ptr<Qp>> qps_;
};

}  // namespace ff::router
