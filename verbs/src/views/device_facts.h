// What the device's views (sysfs_view.h, netlink_view.h) show of it, taken from the verbs'
// own answers, so that no view can disagree with ibv_query_device, ibv_query_port and the
// GID and P_Key tables.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <string>
#include <vector>

namespace ff::verbs {

struct DeviceFacts {
  std::string name;    // ibv_get_device_name: "freeflow0"
  std::string uverbs;  // the uverbs node's name: "uverbs0"
  int index = 0;       // ibv_get_device_index
  ibv_device_attr device{};
  ibv_port_attr port{};  // port 1, the only one
  std::vector<ibv_gid_entry> gids;
  std::vector<uint16_t> pkeys;  // host order
  uint32_t netdev_index = 0;    // the pod's interface that holds its address (GID 0's)
  std::string netdev;           // and its name; both empty when it cannot be told
};

// Opens the process's first device (and so its router session, as ibv_get_device_list
// does), reads everything and closes it again; false when there is no device.
bool QueryDeviceFacts(DeviceFacts* facts);

}  // namespace ff::verbs
