#!/usr/bin/env bash
# Unit: libffverbs.so defines every function the system's libibverbs exports (so no call
# can fall through to libibverbs with one of our objects), exports nothing else but the
# libc functions it interposes (device nodes, rdma_cm, sysfs, RDMA netlink), and needs nothing
# but libc.
set -euo pipefail
lib=$1
sys=$(ldconfig -p | awk '/libibverbs.so.1 / {p = $NF} END {print p}')  # no early exit: SIGPIPE + pipefail
[[ -n "$sys" ]] || { echo "libibverbs.so.1 not found"; exit 1; }
theirs=$(objdump -T "$sys" | awk '/DF \.text/ {print $NF}' | sort -u)
ours=$(nm -D --defined-only "$lib" | awk '{print $NF}' | sort -u)
missing=$(comm -23 <(echo "$theirs") <(echo "$ours"))
# The libc functions the library interposes to answer for the device node UCX checks
# (src/device_files.cc) and to serve /dev/infiniband/rdma_cm (src/cm_device.cc), listed in
# libffverbs.map: exactly these, no other libc name.
libc_names=$(printf '%s\n' __fxstatat __fxstatat64 __lxstat __lxstat64 __xstat __xstat64 access \
  eaccess euidaccess faccessat fstatat fstatat64 lstat lstat64 stat stat64 statx \
  __fxstat __fxstat64 __open_2 __open64_2 __openat_2 __openat64_2 close close_range closefrom \
  dup2 dup3 fstat fstat64 open open64 openat openat64 write \
  canonicalize_file_name chdir closedir dirfd fchdir fdopendir fopen fopen64 getcwd getxattr \
  lgetxattr listxattr llistxattr opendir readdir readdir64 readdir64_r readdir_r readlink \
  readlinkat realpath rewinddir scandir scandir64 seekdir telldir \
  bind getsockname recvfrom recvmsg send sendmsg sendto setsockopt socket | sort)
libc_missing=$(comm -23 <(echo "$libc_names") <(echo "$ours"))
extra=$(comm -13 <(echo "$theirs") <(echo "$ours") | grep -v -E '^(ibv_|_ibv_|verbs_|_verbs_)' |
  grep -vxF -f <(echo "$libc_names") || true)
deps=$(objdump -p "$lib" | awk '/NEEDED/ {print $2}' | grep -v -E '^(libc\.so|ld-linux)' || true)
status=0
[[ -z "$missing" ]] || { echo "FAIL libibverbs exports we do not define:"; echo "$missing"; status=1; }
[[ -z "$libc_missing" ]] || { echo "FAIL interposed libc functions not exported:"; echo "$libc_missing"; status=1; }
[[ -z "$extra" ]] || { echo "FAIL we export names libibverbs does not:"; echo "$extra"; status=1; }
[[ -z "$deps" ]] || { echo "FAIL unexpected shared-library dependencies:"; echo "$deps"; status=1; }
echo "$(wc -l <<<"$theirs") libibverbs functions, all defined; $(wc -l <<<"$ours") exported"
exit $status
