#include "freeflow/ipv4.h"

#include <arpa/inet.h>

#include <charconv>
#include <cstring>

namespace ff {

std::optional<uint32_t> ParseIpv4(std::string_view text) {
  uint32_t addr = 0;
  int parts = 0;
  size_t i = 0;
  while (parts < 4) {
    size_t j = i;
    while (j < text.size() && text[j] >= '0' && text[j] <= '9') ++j;
    if (j == i || j - i > 3) return std::nullopt;
    unsigned value = 0;
    std::from_chars(text.data() + i, text.data() + j, value);
    if (value > 255) return std::nullopt;
    addr = (addr << 8) | value;
    ++parts;
    if (parts < 4) {
      if (j >= text.size() || text[j] != '.') return std::nullopt;
      i = j + 1;
    } else {
      i = j;
    }
  }
  if (i != text.size()) return std::nullopt;
  return addr;
}

std::string FormatIpv4(uint32_t a) {
  return std::to_string(a >> 24) + "." + std::to_string((a >> 16) & 255) + "." +
         std::to_string((a >> 8) & 255) + "." + std::to_string(a & 255);
}

std::optional<Ipv4Prefix> Ipv4Prefix::Parse(std::string_view text) {
  const size_t slash = text.find('/');
  const auto addr = ParseIpv4(text.substr(0, slash));
  if (!addr) return std::nullopt;
  uint32_t len = 32;
  if (slash != std::string_view::npos) {
    const std::string_view l = text.substr(slash + 1);
    if (l.empty() || l.size() > 2) return std::nullopt;
    auto [ptr, ec] = std::from_chars(l.data(), l.data() + l.size(), len);
    if (ec != std::errc() || ptr != l.data() + l.size() || len > 32) return std::nullopt;
  }
  return Containing(*addr, len);
}

bool Ipv4Prefix::Contains(uint32_t a) const { return (a & Mask(length)) == network; }

std::string Ipv4Prefix::ToString() const {
  return FormatIpv4(network) + "/" + std::to_string(length);
}

namespace {
constexpr uint32_t kMaxUnicastLid = 0xbfff;  // 0xc000 and up are multicast LIDs
}

uint16_t LidForIp(uint32_t a, const Ipv4Prefix& overlay) {
  if (!overlay.Contains(a)) return 0;
  const uint32_t offset = a - overlay.network;
  return (offset >= 1 && offset <= kMaxUnicastLid) ? static_cast<uint16_t>(offset) : 0;
}

uint32_t IpForLid(uint16_t lid, const Ipv4Prefix& overlay) {
  if (lid == 0 || lid > kMaxUnicastLid) return 0;
  const uint32_t ip = overlay.network + lid;  // past the prefix (or wrapped): not in it
  return overlay.Contains(ip) ? ip : 0;
}

void Ipv4MappedGid(uint32_t a, uint8_t gid[16]) {
  std::memset(gid, 0, 16);
  gid[10] = 0xff;
  gid[11] = 0xff;
  const uint32_t be = htonl(a);
  std::memcpy(gid + 12, &be, 4);
}

// A link-local GID's first 13 bytes: fe80::/64, then the interface id's locally
// administered EUI-64 prefix built from "FF"; the low 24 bits of the address follow.
constexpr uint8_t kLinkLocalHead[13] = {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x02, 'F', 'F', 0xff, 0xfe};

void LinkLocalGid(uint32_t a, uint8_t gid[16]) {
  std::memcpy(gid, kLinkLocalHead, sizeof(kLinkLocalHead));
  gid[13] = static_cast<uint8_t>(a >> 16);
  gid[14] = static_cast<uint8_t>(a >> 8);
  gid[15] = static_cast<uint8_t>(a);
}

std::optional<uint32_t> IpFromGid(const uint8_t gid[16]) {
  static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (std::memcmp(gid, prefix, 12) != 0) return std::nullopt;
  uint32_t be;
  std::memcpy(&be, gid + 12, 4);
  return ntohl(be);
}

std::optional<uint32_t> IpFromPodGid(const uint8_t gid[16], const Ipv4Prefix& overlay) {
  if (std::optional<uint32_t> mapped = IpFromGid(gid)) return mapped;
  if (overlay.length < 8 || std::memcmp(gid, kLinkLocalHead, sizeof(kLinkLocalHead)) != 0)
    return std::nullopt;
  const uint32_t ip = (overlay.network & 0xff000000u) | (uint32_t{gid[13]} << 16) |
                      (uint32_t{gid[14]} << 8) | gid[15];
  if (!overlay.Contains(ip)) return std::nullopt;
  return ip;
}

}  // namespace ff
