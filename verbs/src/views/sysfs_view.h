// The device's sysfs view: what /sys shows of an RDMA device on Linux, for freeflow0, built
// from the verbs' own answers (ibv_query_device, ibv_query_port, the GID and P_Key tables)
// so that the two never disagree, and served by files/virtual_files.h wherever the pod has
// no such files. The library installs it as the tree's builder when it loads.
//
// The layout is a virtual device's: the device lives under /sys/devices/virtual/freeflow/
// <name> (its `device` link, with local_cpus, local_cpulist and numa_node), with the class
// links /sys/class/infiniband/<name> and /sys/class/infiniband_verbs/<uverbs>:
//
//   infiniband/<name>/   node_type node_guid sys_image_guid fw_ver hw_rev hca_type board_id
//                        node_desc device->
//     ports/1/           state phys_state rate lid sm_lid sm_sl lid_mask_count cap_mask
//                        link_layer gids/N gid_attrs/types/N gid_attrs/ndevs/N pkeys/N
//   infiniband_verbs/<uverbs>/  ibdev abi_version dev device->   (and the class's abi_version)
//
// Formats are the kernel's (drivers/infiniband/core/sysfs.c). Not served: port counters
// (the router counts no per-device traffic a pod could be shown; docs/verbs-library.md),
// hw_counters, and /sys/class/infiniband_mad (freeflow0 answers no MADs).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "files/virtual_tree.h"

namespace ff::verbs {

// The tree for this process's device; nullptr when there is none (no router).
std::shared_ptr<const vfs::Tree> BuildSysfsView();

// The folders the tree holds things under (vfs::SetBuilder's roots): a program that reads
// other missing paths under /sys never opens a router session for them.
std::vector<std::string> SysfsRoots();

// The kernel's text for a port's rate ("100 Gb/sec (4X EDR)") from the verbs' speed and
// width codes.
std::string RateText(uint8_t active_speed, uint8_t active_width);

// A CPU list ("0-3,8") as the kernel prints a mask of `bits` CPUs ("10f"); "" if malformed.
std::string CpuMaskText(const std::string& cpulist, unsigned bits);

}  // namespace ff::verbs
