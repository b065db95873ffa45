// The device over RDMA netlink: what the kernel's NLDEV client (drivers/infiniband/core/
// nldev.c) answers about freeflow0, so that `rdma dev`, `rdma link` and `rdma system` (and
// rdma-core's own netlink lookups) see it as they see a RoCE device. The socket it is
// answered on is netlink_socket.cc's; this is the protocol alone, from DeviceFacts.
//
// Answered: RDMA_NLDEV_CMD_GET (a device, or the dump of all), PORT_GET (a RoCE port's state,
// physical state and netdev) and SYS_GET (network namespaces exclusive, copy-on-fork on, as
// the library behaves). Refused with EOPNOTSUPP: the resource and statistics commands (the
// router, not a process, counts a pod's QPs, CQs and MRs; docs/verbs-library.md) and every
// command that changes something. A request the kernel would refuse (a missing device
// index, a port that does not exist, another netlink client) gets the kernel's error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "views/device_facts.h"

namespace ff::verbs {

// The datagrams answering `request` (one or more netlink messages, as one send carries
// them) for `facts` (nullptr: no device), addressed to the socket `portid`, in order.
std::vector<std::string> AnswerNetlink(const DeviceFacts* facts, const void* request, size_t len,
                                       uint32_t portid);

}  // namespace ff::verbs
