// CDI (Container Device Interface) spec generation. With --cdi-dir the daemon
// writes one spec per resource, kind "<resourcePrefix>/<resourceName>", one
// CDI device per plugin device ID, and Allocate names them in cdi_devices.
#pragma once

#include <string>
#include <vector>

#include "backend.h"

namespace ff::dp {

// Characters outside [A-Za-z0-9_.-] (e.g. ':' in PCI addresses) become '-'.
std::string cdi_device_name(const std::string& device_id);
std::string cdi_qualified_name(const std::string& kind, const std::string& device_id);

// Renders the spec JSON for `devices`, asking `backend` for each device's edits.
std::string render_cdi_spec(const std::string& kind, const std::vector<PluginDevice>& devices,
                            const DeviceBackend& backend);

// Writes `content` to <dir>/<file> atomically (temp file + rename) unless the
// file already holds exactly that. Returns false with *error on failure.
bool write_file_atomically(const std::string& dir, const std::string& file,
                           const std::string& content, std::string* error);

}  // namespace ff::dp
