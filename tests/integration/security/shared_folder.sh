#!/usr/bin/env bash
# Integration: the shared folder as pods see it, bind-mounted read-only (as the device
# plugin mounts it). Pods still load the library and reach the router through it; a root
# pod's attacks on it fail: replacing the library, removing the socket, binding a fake
# router, and holding a file lock to keep a restarted router from starting.
set -uo pipefail
source "$(dirname "$0")/../../../scripts/lib/cluster.sh"
trap cluster_down EXIT
cluster_up 2
router_up || exit 1
failures=0

result() {  # result NAME STATUS
  if [[ $2 -eq 0 ]]; then echo "PASS $1"; else echo "FAIL $1"; failures=$((failures + 1)); fi
}

# ro_pod I CMD...: runs CMD (as root) in pod I, in a mount namespace of its own where the
# folder is bind-mounted read-only over itself, with the library preloaded from there.
ro_pod() {
  local i=$1
  shift
  # shellcheck disable=SC2016  # expanded by the inner shell
  ip netns exec "$(ff_pod_ns "$i")" unshare -m --propagation private sh -c \
    'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"' "$FF_DIR" \
    env FREEFLOW_DIR="$FF_DIR" FFR_NAME=ffrouter LD_PRELOAD="$FF_DIR/libffverbs.so" "$@"
}

# A read-only mount is enough: connect() to a socket needs no write to its mount.
out=$(ro_pod 0 ibv_devinfo -v 2>&1)
grep -q PORT_ACTIVE <<<"$out" && grep -q "GID\[  1\]:.*::ffff:$(ff_pod_ip 0)" <<<"$out"
result "a pod reaches the router through the read-only folder" $?
ro_pod 0 timeout 30 ibv_rc_pingpong -g 1 -n 200 >"$FF_DIR/server.log" 2>&1 &
spid=$!
FF_PIDS+=("$spid")
for ((i = 0; i < 100; i++)); do
  ip netns exec "$(ff_pod_ns 0)" ss -ltn 2>/dev/null | grep -q ':18515 ' && break
  sleep 0.05
done
ro_pod 1 timeout 30 ibv_rc_pingpong -g 1 -n 200 "$(ff_pod_ip 0)" >/dev/null 2>&1
c=$?
wait_pid "$spid" 30
s=$?
[[ $c -eq 0 && $s -eq 0 ]]
result "ibv_rc_pingpong between two pods that see the folder read-only" $?

# The attacks of a root pod. Each must fail inside the pod and leave the folder as it was.
before=$(sha256sum "$FF_DIR/libffverbs.so" | cut -d' ' -f1)
sock_inode=$(stat -c %i "$FF_DIR/ffrouter.sock")
# shellcheck disable=SC2016  # expanded by the inner shell
ro_pod 1 sh -c 'cp /bin/true "$0/libffverbs.so"' "$FF_DIR" 2>/dev/null
[[ $? -ne 0 && $(sha256sum "$FF_DIR/libffverbs.so" | cut -d' ' -f1) == "$before" ]]
result "a pod cannot replace the library" $?
# shellcheck disable=SC2016  # expanded by the inner shell
ro_pod 1 sh -c 'rm -f "$0/ffrouter.sock" && python3 -c "
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.bind(sys.argv[1])" "$0/ffrouter.sock"' "$FF_DIR" 2>/dev/null
[[ $? -ne 0 && $(stat -c %i "$FF_DIR/ffrouter.sock") == "$sock_inode" ]]
result "a pod cannot remove the router's socket or bind a fake router" $?
ro_pod 1 python3 -c '
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.bind(sys.argv[1] + "/fake.sock")' "$FF_DIR" 2>/dev/null
[[ $? -ne 0 && ! -e "$FF_DIR/fake.sock" ]]
result "a pod cannot create a socket in the folder" $?

# flock() needs only read access, so a pod can hold any file of the folder; the router takes
# no lock in the folder, so a pod holding one does not keep a restarted router down.
touch "$FF_DIR/ffrouter.lock"
# The holder outlives the restart below; its output goes nowhere, so that nothing of it keeps
# the test's output open (ctest waits for that) once the test is done.
ro_pod 1 flock -x "$FF_DIR/ffrouter.lock" sleep 5 >/dev/null 2>&1 &
holder=$!
FF_PIDS+=("$holder")
sleep 0.3
router_down
router_up
result "a pod holding a file lock in the folder does not stop the router from restarting" $?
out=$(ro_pod 0 ibv_devices 2>&1)
grep -q freeflow0 <<<"$out"
result "the restarted router serves pods" $?

[[ $failures -eq 0 ]]
