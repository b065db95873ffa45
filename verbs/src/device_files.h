// The device node that programs check before they use a device. libibverbs itself never
// looks at /dev/infiniband/<dev_name> for freeflow's device (the library opens no file),
// but UCX does: uct_ib_device_is_accessible() drops every device whose node is not a
// character device it may read and write. A pod has no such file and must not need
// privileges or a host mount for one, so the library answers stat() and access() of that
// one path in-process (device_files.cc), once this process has the device.
#pragma once

#include <string>

namespace ffv {

// "/dev/infiniband/" + dev_name: where libibverbs' uverbs node of a device lives.
std::string DeviceNodePath(const char* dev_name);

// From now on, the stat and access families answer for `path` (absolute) as for a
// character device 231:192 with mode 0666, whenever the real call fails with ENOENT;
// a real file there always wins. Thread-safe; the last call wins.
void ServeDeviceNode(const std::string& path);

// Stops answering (tests).
void StopServingDeviceNode();

}  // namespace ffv
