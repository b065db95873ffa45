#!/usr/bin/env bash
# Integration: pods that try to be another pod, against the real router in real network
# namespaces. Pods run as root with every capability in their namespace (NET_ADMIN
# included). Each attack must be refused with its reason, while an ibv_rc_pingpong between
# two other pods runs through all of them and completes.
set -uo pipefail
source "$(dirname "$0")/../../../scripts/lib/cluster.sh"
trap cluster_down EXIT
cluster_up 4
router_up || exit 1
VICTIM=$(ff_pod_ip 0)
GATEWAY="10.244.${FF_NET}.1"
failures=0

result() {  # result NAME STATUS
  if [[ $2 -eq 0 ]]; then echo "PASS $1"; else echo "FAIL $1"; failures=$((failures + 1)); fi
}

# refused NAME REASON CMD...: CMD (a verbs program) must get no device, and the router's
# reason must reach it.
refused() {
  local name=$1 reason=$2 out
  shift 2
  out=$("$@" 2>&1)
  ! grep -q freeflow0 <<<"$out" && grep -q "refused this process.*$reason" <<<"$out"
  local st=$?
  [[ $st -ne 0 ]] && echo "$out" | tail -n 3
  result "$name" $st
}

# The victim (pod 0) holds a session throughout (a server no one connects to), and it and
# a peer (pod 1) keep traffic going (in event mode: busy polling would crawl on a small,
# shared machine).
pod_bg 0 ibv_rc_pingpong -g 1 -p 18600 >/dev/null 2>&1
for ((i = 0; i < 600; i++)); do
  ip netns exec "$(ff_pod_ns 0)" ss -ltn 2>/dev/null | grep -q ':18600 ' && break
  sleep 0.05
done
pod_bg 0 ibv_rc_pingpong -g 1 -e -n 20000 >"$FF_DIR/pp-server.log" 2>&1
ppid=$FF_LAST_PID
for ((i = 0; i < 600; i++)); do
  ip netns exec "$(ff_pod_ns 0)" ss -ltn 2>/dev/null | grep -q ':18515 ' && break
  sleep 0.05
done
pod_bg 1 ibv_rc_pingpong -g 1 -e -n 20000 "$VICTIM" >"$FF_DIR/pp-client.log" 2>&1
pcid=$FF_LAST_PID
for ((i = 0; i < 600; i++)); do  # connected: the attacks start while it runs
  grep -q "remote address" "$FF_DIR/pp-client.log" && break
  sleep 0.05
done

# 1. NET_ADMIN: the victim's address added to lo. The namespace is now ambiguous.
ns=$(ff_pod_ns 2)
ip -n "$ns" addr add "$VICTIM/32" dev lo
refused "a pod that adds the victim's address to lo is refused" "2 addresses inside the overlay" \
  pod_run 2 ibv_devices
# 2. ... and with its own address removed, the victim's address on lo is its only one.
ip -n "$ns" addr del "$(ff_pod_ip 2)/24" dev eth0
refused "the victim's address on lo alone is refused" "on a loopback interface" pod_run 2 ibv_devices
ip -n "$ns" addr del "$VICTIM/32" dev lo
ip -n "$ns" addr add "$(ff_pod_ip 2)/24" dev eth0
# 3. A down interface holds no identity.
ip -n "$ns" link set eth0 down
refused "an address on an interface that is down is refused" "is down" pod_run 2 ibv_devices
ip -n "$ns" link set eth0 up
# 4. A namespace of its own (unshare -n): an interface whose partner is in that namespace
#    too (a veth pair), with any overlay address.
refused "an address in a namespace the pod made itself is refused" "not linked to the router" \
  pod_run 2 unshare -n sh -c "ip link add d0 type veth peer name d1 &&
    ip addr add $VICTIM/24 dev d0 && ip link set d1 up && ip link set d0 up && exec ibv_devices"
# 5. Renumbering its only interface to the victim's address while the victim is connected
#    (taken off the bridge first, so that the two addresses do not fight over the wire).
ns=$(ff_pod_ns 3)
ip -n "$FF_NODE" link set "ffv${FF_TAG}x3" nomaster
ip -n "$ns" addr flush dev eth0
ip -n "$ns" addr add "$VICTIM/24" dev eth0
refused "a second namespace claiming an address in use is refused" "in use by another network" \
  pod_run 3 ibv_devices
grep -q "suspected impersonation" "$FF_DIR/router.log"
result "the router logs the claim as a suspected impersonation" $?
# 6. A process in the router's own network namespace (host network).
refused "a client in the router's network namespace is refused" "router's own network namespace" \
  ip netns exec "$FF_NODE" env FREEFLOW_DIR="$FF_DIR" LD_PRELOAD="$FF_DIR/libffverbs.so" ibv_devices

wait_pid "$pcid" 240
c=$?
wait_pid "$ppid" 30
s=$?
tail -n 1 "$FF_DIR/pp-client.log"
[[ $c -ne 0 || $s -ne 0 ]] && tail -n 5 "$FF_DIR/pp-server.log" "$FF_DIR/pp-client.log"
[[ $c -eq 0 && $s -eq 0 ]] && kill -0 "$FF_ROUTER_PID"
result "ibv_rc_pingpong between two other pods completed through every attack" $?
out=$(pod_run 0 ibv_devinfo -v 2>&1)
grep -q "GID\[  1\]:.*::ffff:$VICTIM" <<<"$out"
result "the victim is still served as itself" $?

# With --allow-host-network-clients, the router's namespace is served as its one overlay
# address (the bridge's), and the router says so loudly at start-up.
router_down
router_up --allow-host-network-clients || exit 1
grep -q "allow-host-network-clients is set" "$FF_DIR/router.log"
result "the router warns at start-up that host network clients are served" $?
out=$(ip netns exec "$FF_NODE" env FREEFLOW_DIR="$FF_DIR" LD_PRELOAD="$FF_DIR/libffverbs.so" \
  ibv_devinfo -v 2>&1)
grep -q "GID\[  1\]:.*::ffff:$GATEWAY" <<<"$out"
result "with the flag, a client in the router's namespace is served as $GATEWAY" $?

[[ $failures -eq 0 ]]
