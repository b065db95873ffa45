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
  // The netmask of a prefix `length` bits long (0..32), and the prefix of that length that
  // holds `addr` (host order).
  static uint32_t Mask(uint32_t length) { return length == 0 ? 0 : ~0u << (32 - length); }
  static Ipv4Prefix Containing(uint32_t addr, uint32_t length) {
    return Ipv4Prefix{addr & Mask(length), length};
  }
  bool Contains(uint32_t addr_host_order) const;
  std::string ToString() const;
};

// Parses a dotted-quad address into host byte order.
std::optional<uint32_t> ParseIpv4(std::string_view text);
std::string FormatIpv4(uint32_t addr_host_order);

// The LID a pod's port reports: the offset of its address in the overlay prefix (for a /16
// overlay, the low 16 bits of the address) when that is a valid unicast LID (1..0xBFFF); 0
// otherwise (the pod is then reachable by GID only: addresses from x.y.192.0 on in a /16).
// Every router and pod of a cluster shares the overlay prefix, so a LID names one pod in
// the whole cluster, and IpForLid turns it back into the address the control plane knows.
uint16_t LidForIp(uint32_t addr_host_order, const Ipv4Prefix& overlay);
// The overlay address (host order) whose LID is `lid`; 0 when no address has it.
uint32_t IpForLid(uint16_t lid, const Ipv4Prefix& overlay);

// GID index 1 of a pod's port: the IPv4-mapped address ::ffff:a.b.c.d (RoCE v2).
void Ipv4MappedGid(uint32_t addr_host_order, uint8_t gid[16]);
// GID index 0: a link-local GID fe80::/64 whose interface id is derived from the
// address (RoCE v1 style), so that it is stable and unique per pod.
void LinkLocalGid(uint32_t addr_host_order, uint8_t gid[16]);
// The IPv4 address inside an IPv4-mapped GID, or std::nullopt.
std::optional<uint32_t> IpFromGid(const uint8_t gid[16]);
// The address a destination GID names: index 1 of a port (IPv4-mapped, any address, as
// IpFromGid) or index 0 (LinkLocalGid, which carries the low 24 bits of the address: the
// rest comes from `overlay`, so that needs an overlay of /8 or longer and gives only an
// address inside it). std::nullopt for any other GID.
std::optional<uint32_t> IpFromPodGid(const uint8_t gid[16], const Ipv4Prefix& overlay);

}  // namespace ff
