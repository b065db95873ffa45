#!/usr/bin/env bash
# Integration: unmodified ibverbs utilities and perftest between two pods of one node,
# over the real router and the preloaded library. Usage: verbs_tools.sh [devices|views|preload|pingpong|perftest|perftest-mlx5]
set -uo pipefail
source "$(dirname "$0")/../../../scripts/lib/cluster.sh"
trap cluster_down EXIT
cluster_up 2
router_up || exit 1
SERVER=$(ff_pod_ip 0)
failures=0

check() {  # check NAME STATUS
  if [[ $2 -eq 0 ]]; then echo "PASS $1"; else echo "FAIL $1 (status $2)"; failures=$((failures + 1)); fi
}

# pair NAME VENDOR CMD...: server in pod 0, client in pod 1, both must exit 0 (again once when
# perftest could not measure the CPU clock: perftest_clock_failed).
pair() {
  again_if_perftest_clock_failed pair_once "$@"
  check "$1" $?
}
# pair_once NAME VENDOR CMD...: one run of the pair; its status.
pair_once() {
  local vendor=$2
  shift 2
  pod_bg 0 env FFV_VENDOR="$vendor" FFV_LOG=debug "$@" >"$FF_DIR/server.log" 2>&1
  local spid=$FF_LAST_PID i
  for ((i = 0; i < 100; i++)); do  # wait until the server listens for its peer
    ip netns exec "$(ff_pod_ns 0)" ss -ltn 2>/dev/null | grep -qE ':(18515|18516|18517) ' && break
    sleep 0.05
  done
  pod_run 1 env FFV_VENDOR="$vendor" FFV_LOG=debug timeout 60 "$@" "$SERVER" >"$FF_DIR/client.log" 2>&1
  local c=$?
  wait_pid "$spid" 30
  local s=$?
  local st=$((c != 0 || s != 0))
  if [[ $st -ne 0 ]]; then
    echo "--- server"; log_tail "$FF_DIR/server.log"; echo "--- client"; log_tail "$FF_DIR/client.log"
  fi
  if [[ $vendor == mlx5 && $st -eq 0 ]] && ! grep -q "ibv_wr_\* API" "$FF_DIR/client.log"; then
    echo "--- client did not use the ibv_wr_* API"; st=1
  fi
  return $st
}

case ${1:-all} in
  devices)
    out=$(pod_run 0 ibv_devices 2>&1); echo "$out"
    grep -q freeflow0 <<<"$out"; check "ibv_devices lists freeflow0" $?
    out=$(pod_run 1 ibv_devinfo -v 2>&1); echo "$out" | head -20
    grep -q "PORT_ACTIVE" <<<"$out" && grep -q "link_layer:.*Ethernet" <<<"$out" &&
      grep -q "GID\[  1\]:.*::ffff:$(ff_pod_ip 1)" <<<"$out"
    check "ibv_devinfo -v shows an active Ethernet port with the pod's IPv4-mapped GID" $?
    ;;
  views)
    # The device as tools see it beside the verbs, in a pod, by a process without privileges
    # (nobody, no capabilities) and no host mount of /sys: its sysfs files (infiniband-diags,
    # ibv_devinfo, and a program of ours that checks every entry against the verbs,
    # sysfs_check.cc) and RDMA netlink (iproute2's rdma).
    chmod 755 "$FF_DIR"  # the test's own folder: nobody reaches the socket and the library
    nobody=(setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all --bounding-set=-all --)
    devinfo=$(pod_run 0 "${nobody[@]}" ibv_devinfo -v 2>&1)
    guid=$(awk '/node_guid:/ {gsub(":", "", $2); print $2}' <<<"$devinfo")
    gid0=$(awk '/GID\[  0\]:/ {sub(",", "", $3); print $3}' <<<"$devinfo")
    out=$(pod_run 0 "${nobody[@]}" ibstat 2>&1); echo "$out"
    [[ ${#guid} -eq 16 && ${#gid0} -eq 39 ]] && grep -q "CA 'freeflow0'" <<<"$out" && grep -q "State: Active" <<<"$out" &&
      grep -q "Physical state: LinkUp" <<<"$out" && grep -q "Link layer: Ethernet" <<<"$out" &&
      grep -q "Node GUID: 0x$guid" <<<"$out" && grep -q "Port GUID: 0x${gid0:20:4}${gid0:25:4}${gid0:30:4}${gid0:35:4}" <<<"$out"
    check "ibstat shows freeflow0 with ibv_devinfo's GUIDs, an active port, link layer Ethernet" $?
    out=$(pod_run 0 "${nobody[@]}" ibstatus 2>&1); echo "$out"
    [[ -n $gid0 ]] && grep -q "default gid:.*$gid0" <<<"$out" && grep -q "state:.*4: ACTIVE" <<<"$out" &&
      grep -q "link_layer:.*Ethernet" <<<"$out"
    check "ibstatus shows freeflow0's default GID, state and link layer" $?
    grep -q "board_id:.*FREEFLOW_VIRTUAL" <<<"$devinfo"
    check "ibv_devinfo -v reads the board id from sysfs" $?
    pod_run 0 "${nobody[@]}" "$FF_SYSFS_CHECK" >"$FF_DIR/sysfs_check.log" 2>&1
    st=$?; grep -v "^PASS" "$FF_DIR/sysfs_check.log"; tail -n 1 "$FF_DIR/sysfs_check.log"
    check "every sysfs entry matches the verbs' answer" $st
    out=$(pod_run 0 "${nobody[@]}" rdma dev show 2>&1); echo "$out"
    grep -qE "^0: freeflow0: node_type ca fw freeflow-0.1 node_guid ${guid:0:4}:${guid:4:4}:${guid:8:4}:${guid:12:4} " <<<"$out"
    check "rdma dev show lists freeflow0 with its node GUID" $?
    out=$(pod_run 0 "${nobody[@]}" rdma link show 2>&1); echo "$out"
    grep -qE "^link freeflow0/1 state ACTIVE physical_state LINK_UP netdev eth0 *$" <<<"$out"
    check "rdma link show shows port 1 active on the pod's eth0" $?
    out=$(pod_run 0 "${nobody[@]}" rdma system show 2>&1); echo "$out"
    grep -q "netns exclusive copy-on-fork on" <<<"$out"
    check "rdma system show: namespaces exclusive, copy-on-fork" $?
    out=$(pod_run 0 "${nobody[@]}" rdma resource show 2>&1); st=$?; echo "$out"
    [[ $st -ne 0 ]] && grep -q "Operation not supported" <<<"$out"
    check "rdma resource show is refused as documented (the router counts a pod's objects)" $?
    ;;
  preload)
    # A program that never calls verbs is untouched by the preload: no router contact.
    out=$(pod_run 0 sh -c 'echo plain-program' 2>&1)
    [[ $out == plain-program ]]; check "a program without verbs is unaffected by the preload" $?
    # Steady state costs no system call: the syscall count of a polling perftest client
    # must not grow with the number of messages. Each count is the fewest of three runs: a
    # busy machine only adds calls (a wait that finds its peer off the CPU sleeps; one
    # make test added 203 once), while a call per message would show in every run.
    count_syscalls() {  # count_syscalls TOOL ITERATIONS
      local n fewest=""
      for _ in 1 2 3; do
        n=$(count_syscalls_once "$1" "$2")
        [[ -n $n ]] && { [[ -z $fewest ]] || ((n < fewest)); } && fewest=$n
      done
      echo "$fewest"
    }
    count_syscalls_once() {  # count_syscalls_once TOOL ITERATIONS
      pod_bg 0 "$1" -n "$2" >/dev/null 2>&1
      local spid=$FF_LAST_PID i
      for ((i = 0; i < 100; i++)); do
        ip netns exec "$(ff_pod_ns 0)" ss -ltn 2>/dev/null | grep -q ':18515 ' && break
        sleep 0.05
      done
      pod_run 1 strace -f -c -o "$FF_DIR/strace.txt" "$1" -n "$2" "$SERVER" >/dev/null 2>&1
      wait_pid "$spid" 30 >/dev/null
      awk '$NF == "total" {print $4 + 0}' "$FF_DIR/strace.txt" | tail -n 1
    }
    for tool in ib_send_lat ib_write_bw; do
      small=$(count_syscalls $tool 1000)
      large=$(count_syscalls $tool 21000)
      echo "$tool: $small system calls for 1000 messages, $large for 21000"
      # 20000 more messages may cost a handful of calls (page faults excluded), not one each.
      [[ -n $small && -n $large && $((large - small)) -lt 200 ]]
      check "$tool makes no system call per message" $?
    done
    ;;
  pingpong)
    for t in rc uc ud srq; do
      for e in "" "-e"; do pair "ibv_${t}_pingpong $e" "" "ibv_${t}_pingpong" -g 1 $e -n 500; done
    done
    pair "ibv_rc_pingpong by LID (no GID)" "" ibv_rc_pingpong -n 200
    # GID index 0, the port's link-local (RoCE v1) GID, names the peer too.
    for t in rc ud; do pair "ibv_${t}_pingpong -g 0" "" "ibv_${t}_pingpong" -g 0 -n 200; done
    ;;
  perftest | perftest-mlx5)
    vendor=""; [[ $1 == perftest-mlx5 ]] && vendor=mlx5
    pair "ib_send_bw RC" "$vendor" ib_send_bw -n 2000
    pair "ib_send_bw UC" "$vendor" ib_send_bw -c UC -n 2000
    pair "ib_send_bw UD" "$vendor" ib_send_bw -c UD -n 2000
    pair "ib_send_bw -a" "$vendor" ib_send_bw -a -n 50
    pair "ib_send_bw -e" "$vendor" ib_send_bw -e -n 2000
    pair "ib_send_bw -b" "$vendor" ib_send_bw -b -n 2000
    pair "ib_send_bw --use-srq" "$vendor" ib_send_bw --use-srq -n 2000
    pair "ib_write_bw -q 4" "$vendor" ib_write_bw -q 4 -n 2000
    pair "ib_write_bw -D 2" "$vendor" ib_write_bw -D 2
    pair "ib_read_bw -q 30" "$vendor" ib_read_bw -q 30 -n 500
    pair "ib_atomic_bw CMP_AND_SWAP" "$vendor" ib_atomic_bw -A CMP_AND_SWAP -n 2000
    pair "ib_atomic_bw FETCH_AND_ADD" "$vendor" ib_atomic_bw -A FETCH_AND_ADD -n 2000
    pair "ib_send_lat" "$vendor" ib_send_lat -n 2000
    pair "ib_write_lat" "$vendor" ib_write_lat -n 2000
    pair "ib_read_lat" "$vendor" ib_read_lat -n 2000
    pair "ib_atomic_lat" "$vendor" ib_atomic_lat -n 2000
    # Event mode takes one event per completion: a spurious or reordered event used to put
    # it out of step after a few hundred iterations.
    pair "ib_send_lat -e" "$vendor" ib_send_lat -e -n 5000
    pair "ib_read_lat -e" "$vendor" ib_read_lat -e -n 2000
    ;;
esac
echo "$((failures == 0 ? 1 : 0)) passed, $failures failed" >/dev/null
[[ $failures -eq 0 ]]
