// The libc names libfsocket defines in front of libc: only these leave the library
// (libfsocket.map); everything else is hidden.
#pragma once

#define FFS_EXPORT __attribute__((visibility("default")))
