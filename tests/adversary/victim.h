// What the victim of the adversary suite and its attackers agree on: where the victim tells
// its address and QPNs, and the marker its secrets start with (an attacker that finds the
// marker in memory it was handed has read the victim's memory).
#pragma once

namespace ff::adversary {

inline constexpr char kSecretMarker[] = "FFSECRET:";
// The Q_Key of the victims' UD QPs (a UD sender may know it: it is no secret).
inline constexpr unsigned kVictimQkey = 0x11111111;
// In the suite's folder: "<overlay IPv4> <RC QPN> <UD QPN>", written once the victim is set.
inline constexpr char kVictimFile[] = "victim";
// In the suite's folder: made by the script when every attack is over.
inline constexpr char kVictimRelease[] = "victim.release";

}  // namespace ff::adversary
