// Overlay addressing helpers: IPv4 prefixes (VNET_PREFIX), the GIDs and LID that a pod's
// virtual port derives from its overlay address.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace ff {

struct Ipv4Prefix {
  uint32_t network = 0;  // host byte order, host bits cleared
  uint32_t length = 0;   // 0..32

  // Parses "a.b.c.d/len" (a bare address means /32). std::nullopt on any malformed input.
  static std::optional<Ipv4Prefix> Parse(std::string_view text);
  bool Contains(uint32_t addr_host_order) const;
  std::string ToString() const;
};

// Parses a dotted-quad address into host byte order.
std::optional<uint32_t> ParseIpv4(std::string_view text);
std::string FormatIpv4(uint32_t addr_host_order);

// The LID a pod's port reports: the low 16 bits of its overlay address when that is a
// valid unicast LID (1..0xBFFF), which holds for every address of a /16 overlay below
// x.y.192.0; 0 otherwise (the pod is then reachable by GID only).
uint16_t LidForIp(uint32_t addr_host_order);

// GID index 1 of a pod's port: the IPv4-mapped address ::ffff:a.b.c.d (RoCE v2).
void Ipv4MappedGid(uint32_t addr_host_order, uint8_t gid[16]);
// GID index 0: a link-local GID fe80::/64 whose interface id is derived from the
// address (RoCE v1 style), so that it is stable and unique per pod.
void LinkLocalGid(uint32_t addr_host_order, uint8_t gid[16]);
// The IPv4 address inside an IPv4-mapped GID, or std::nullopt.
std::optional<uint32_t> IpFromGid(const uint8_t gid[16]);

}  // namespace ff
