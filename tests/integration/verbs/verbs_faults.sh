#!/usr/bin/env bash
# Integration: isolation and failure semantics between pods, with the real router.
set -uo pipefail
source "$(dirname "$0")/../../../scripts/lib/cluster.sh"
FAULTS=${FF_FAULTS:-$FF_BUILD/tests/integration/verbs/verbs_faults}
REOPEN=${FF_REOPEN:-$FF_BUILD/tests/integration/verbs/verbs_reopen}
trap cluster_down EXIT
cluster_up 3
router_up || exit 1
SERVER=$(ff_pod_ip 0)
failures=0
port=19000

result() {  # result NAME STATUS
  if [[ $2 -eq 0 ]]; then echo "PASS $1"; else echo "FAIL $1"; failures=$((failures + 1)); fi
}

# Access checks: each test gets a fresh server/client pair.
for t in access oob noaccess dereg rnr; do
  port=$((port + 1))
  pod_bg 0 "$FAULTS" server $port >"$FF_DIR/server.log" 2>&1
  spid=$FF_LAST_PID
  pod_run 1 timeout 30 "$FAULTS" client "$SERVER" $port $t >"$FF_DIR/client.log" 2>&1
  c=$?
  if [[ $t == rnr ]]; then kill "$spid" 2>/dev/null; fi
  wait_pid "$spid" 10 >/dev/null 2>&1
  cat "$FF_DIR/client.log"
  result "verbs_faults $t" $c
done

pod_run 2 timeout 30 "$FAULTS" overlap
result "overlapping registrations merge and keep their keys" $?

# A killed peer and a killed router turn into error completions, not hangs.
# shellcheck disable=SC2012  # descriptors are numbers
fd_count() { ls "/proc/$FF_ROUTER_PID/fd" | wc -l; }
for victim in peer router; do
  port=$((port + 1))
  base_fds=$(fd_count)
  pod_bg 0 "$FAULTS" server $port >"$FF_DIR/server.log" 2>&1
  spid=$FF_LAST_PID
  pod_bg 1 "$FAULTS" client "$SERVER" $port peer_gone >"$FF_DIR/client.log" 2>&1
  cpid=$FF_LAST_PID
  for ((i = 0; i < 200; i++)); do grep -q READY "$FF_DIR/client.log" && break; sleep 0.05; done
  if [[ $victim == peer ]]; then kill -9 "$spid"; else router_down; fi
  wait_pid "$cpid" 30
  c=$?
  cat "$FF_DIR/client.log"
  result "error completions after the $victim was killed" $c
  kill -9 "$spid" 2>/dev/null
  wait "$spid" 2>/dev/null
  if [[ $victim == peer ]]; then
    # Everything the router held for the two exited processes must be released.
    for ((i = 0; i < 100; i++)); do [[ $(fd_count) -le $base_fds ]] && break; sleep 0.05; done
    after=$(fd_count)
    echo "router descriptors: $base_fds before, $after after both processes exited"
    [[ $after -le $base_fds ]]
    result "router releases a killed pod's resources" $?
  fi
done
router_up || exit 1

# A router killed with SIGKILL and started again: the same two processes get DEVICE_FATAL and
# error completions, destroy what they held, open the new router's device and run again.
port=$((port + 1))
pod_bg 0 "$REOPEN" server $port >"$FF_DIR/reopen-server.log" 2>&1
spid=$FF_LAST_PID
pod_bg 1 "$REOPEN" client "$SERVER" $port >"$FF_DIR/reopen-client.log" 2>&1
cpid=$FF_LAST_PID
for ((i = 0; i < 400; i++)); do
  grep -q READY "$FF_DIR/reopen-server.log" && grep -q READY "$FF_DIR/reopen-client.log" && break
  sleep 0.05
done
router_down KILL
router_up || exit 1
wait_pid "$cpid" 90
c=$?
wait_pid "$spid" 30
s=$?
echo "--- server"; cat "$FF_DIR/reopen-server.log"; echo "--- client"; cat "$FF_DIR/reopen-client.log"
[[ $c -eq 0 && $s -eq 0 ]] && grep -q "^PASS reopened device index 1 " "$FF_DIR/reopen-server.log" &&
  grep -q "^PASS reopened device index 1 " "$FF_DIR/reopen-client.log"
result "after a router killed and started again, the same processes reopen the device and run" $?

# A pod killed while holding QPs, CQs and MRs: its resources are released.
base_fds=$(fd_count)
pod_bg 2 "$FAULTS" hold >"$FF_DIR/hold.log" 2>&1
hpid=$FF_LAST_PID
for ((i = 0; i < 200; i++)); do grep -q READY "$FF_DIR/hold.log" && break; sleep 0.05; done
held=$(fd_count)
kill -9 "$hpid"; wait "$hpid" 2>/dev/null
for ((i = 0; i < 100; i++)); do [[ $(fd_count) -le $base_fds ]] && break; sleep 0.05; done
after=$(fd_count)
echo "router descriptors: $base_fds idle, $held while the pod held resources, $after after kill -9"
[[ $held -gt $base_fds && $after -le $base_fds ]]
result "killed pod's resources freed" $?

# Hostile clients are disconnected while other pods keep working.
pod_bg 0 ibv_rc_pingpong -g 1 -n 20000 >"$FF_DIR/pp-server.log" 2>&1
ppid=$FF_LAST_PID
sleep 0.3
pod_bg 1 ibv_rc_pingpong -g 1 -n 20000 "$SERVER" >"$FF_DIR/pp-client.log" 2>&1
pcid=$FF_LAST_PID
pod_run 2 "$FAULTS" hostile "$FF_DIR/ffrouter.sock"
result "hostile messages get the sender disconnected" $?
wait_pid "$pcid" 60; c=$?
wait_pid "$ppid" 10; s=$?
tail -n 1 "$FF_DIR/pp-client.log"
[[ $c -eq 0 && $s -eq 0 ]] && kill -0 "$FF_ROUTER_PID"
result "other pods kept working and the router survived" $?

# A QP created under a granted number (posted) that the pod's quota refuses after all: the
# program's QP fails (QP_FATAL), it does not silently not exist.
router_down
router_up --max-qps-per-pod 18 || exit 1
pod_run 2 timeout 30 "$FAULTS" refused
result "a posted QP create the pod's quota refuses fails that QP" $?

# Start-up errors are clear and fail fast.
out=$(ip netns exec "$FF_NODE" "$FF_BUILD/router/ffrouter" --dir "$FF_DIR" --vnet-prefix 10.244.0.0/16 2>&1)
st=$?
echo "$out" | tail -n 1
[[ $st -ne 0 ]] && grep -q "another router" <<<"$out"
result "a second router on the same socket is refused" $?
out=$("$FF_BUILD/router/ffrouter" --dir /nonexistent-freeflow --vnet-prefix 10.244.0.0/16 2>&1)
st=$?
[[ $st -ne 0 ]] && grep -q "not a directory" <<<"$out"
result "an unusable --dir is refused" $?
out=$("$FF_BUILD/router/ffrouter" --dir "$FF_DIR" --vnet-prefix 10.244.0/99 2>&1)
st=$?
[[ $st -ne 0 ]] && grep -q "not an IPv4 prefix" <<<"$out"
result "a bad --vnet-prefix is refused" $?
# A process outside the overlay gets a clear error, not a device.
out=$(env FREEFLOW_DIR="$FF_DIR" LD_PRELOAD="$FF_DIR/libffverbs.so" ibv_devices 2>&1)
grep -q "overlay prefix" <<<"$out"
result "a client outside the overlay is told why" $?

echo "$((failures == 0 ? 1 : 0)) suites ok"
[[ $failures -eq 0 ]]
