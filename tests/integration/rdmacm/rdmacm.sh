#!/usr/bin/env bash
# Integration (issue 12): rdma_cm on pod addresses. Unmodified librdmacm programs (Debian
# rdmacm-utils, perftest -R) between pod 0 (server) and pod 1 (client) of one node (same)
# or of two nodes (cross, TLS node links), UCX's client/server API and libfabric's verbs
# provider, and the error cases with cm_errors and mckey. One case a run, so that a failure
# names it:
#   rdmacm.sh same|cross rping|ucmatose|udaddy|rdma_server|rdma_xserver|rstream|riostream|
#                        udpong|cmtime|rcopy|ib_send_bw|ib_write_bw|ib_read_lat|ucp-sockaddr|
#                        libfabric|noconn|badaddr|mckey|peer-killed|router-killed|
#                        router-replaced|both-disconnect|fork
# Each pair: the server first, both bounded, both exit statuses checked, and one check of
# their output that proves data moved (or, for the error cases, that the expected event came
# within its bound).
set -uo pipefail
source "$(dirname "$0")/../../../scripts/lib/cluster.sh"
export FF_ROUTER_LOG=info  # cm_wait_listen reads the router's rdma_cm listens
CM_ERRORS=${FF_CM_ERRORS:-$FF_BUILD/tests/integration/rdmacm/cm_errors}
UCP_SOCKADDR=${FF_UCP_SOCKADDR:-$FF_BUILD/tests/integration/rdmacm/ucp_sockaddr}
where=${1:?same or cross}
case=${2:?which case}
CM_BOUND=5  # seconds from a kill to the event it must cause (DISCONNECTED, DEVICE_REMOVAL)

trap two_pods_down EXIT
# The routers know the pod subnets from a control plane, on one node as on two (as in any
# deployment): a pod where nothing runs yet is a pod, not an unknown address.
FF_KNOWN_PODS=1 two_pods_up "$where" || exit 1
S=$(ff_pod_ip 0)
failures=0
check() { if [[ $2 -eq 0 ]]; then echo "PASS $1 ($where node)"; else echo "FAIL $1 ($where node)"; failures=$((failures + 1)); fi; }
now_ms() { echo $(($(date +%s%N) / 1000000)); }
logs() {  # the tails of both sides' output (stderr, then stdout), after a failure
  local side
  for side in server client; do
    echo "--- $side"
    [[ -f $FF_DIR/$side.log ]] || { echo "(it did not run)"; continue; }
    tail -n "${1:-20}" "$FF_DIR/$side.err" 2>/dev/null
    tail -n "${1:-20}" "$FF_DIR/$side.log"
  done
}

# cm_pair SERVER_CMD... -- CLIENT_CMD...: the server in pod 0, then, once the router says
# it listens, the client in pod 1; 0 when both exit 0 (the client within 60 s, the server
# 30 s after it). Their stdout goes to $FF_DIR/server.log and client.log, which the checks
# read, their stderr to server.err and client.err (unbuffered, it would land inside
# stdout's lines); stdout is line-buffered (stdbuf) so that a side killed at its deadline
# leaves what it had done. With CM_SERVER_STAYS=1 (servers that serve until stopped:
# cmtime, rcopy) the server must instead still be serving after the client; it is stopped.
# listened_again: pod 0's router has seen its server listen on $S a second time (perftest's
# server listens anew for its test; a client rejected before that lost perftest's race).
listened_again() { [[ $(grep -c "rdma_cm listens on $S:" "$(pod_router_log 0)") -ge 2 ]]; }

cm_pair() {
  local -a srv=() cli=()
  while [[ $1 != -- ]]; do srv+=("$1"); shift; done
  shift
  cli=("$@")
  local c s spid mark
  mark=$(cm_listen_mark 0)
  pod_bg 0 stdbuf -oL "${srv[@]}" >"$FF_DIR/server.log" 2>"$FF_DIR/server.err"
  spid=$FF_LAST_PID
  if ! cm_wait_listen 0 "$spid" "$mark"; then
    kill "$spid" 2>/dev/null
    wait "$spid"
    echo "the server did not listen within 5 s (status $?)"
    logs
    return 1
  fi
  pod_run 1 timeout "${CM_CLIENT_BOUND:-60}" stdbuf -oL "${cli[@]}" >"$FF_DIR/client.log" 2>"$FF_DIR/client.err"
  c=$?
  if [[ $c -ne 0 ]] && perftest_lost_race "$FF_DIR"/client.{log,err}; then
    # perftest's server waits for a client that will not come (again_if_perftest_raced runs
    # the pair again): it would time out only after CM_SERVER_BOUND. Its second listen, which
    # tells the race from another rejection, is let happen first (at most 2 s).
    local i
    for ((i = 0; i < 40; i++)); do
      listened_again && break
      kill -0 "$spid" 2>/dev/null || break
      sleep 0.05
    done
    kill "$spid" 2>/dev/null
    wait "$spid" 2>/dev/null
    s=1
  elif [[ ${CM_SERVER_STAYS:-0} == 1 ]]; then
    s=0
    kill -0 "$spid" 2>/dev/null || { echo "the server exited while serving"; s=1; }
    kill "$spid" 2>/dev/null
    wait "$spid" 2>/dev/null
  else
    wait_pid "$spid" "${CM_SERVER_BOUND:-30}"
    s=$?
  fi
  [[ $c -ne 0 || $s -ne 0 ]] && { echo "client exit $c, server exit $s"; logs; }
  [[ $c -eq 0 && $s -eq 0 ]]
}

# has LOG REGEX [COUNT]: LOG has a line matching REGEX (exactly COUNT of them when given).
has() {
  local n
  n=$(grep -cE "$2" "$1")
  if [[ -n ${3:-} ]]; then [[ $n -eq $3 ]] || { echo "$(basename "$1"): $n lines match '$2', want $3"; return 1; }; fi
  [[ $n -gt 0 ]] || { echo "$(basename "$1"): no line matches '$2'"; return 1; }
}

# again_if_perftest_raced CMD...: CMD, and again (9 more times at most) while perftest -R
# loses its own race. perftest meets twice over rdma_cm: a connection to exchange
# parameters, then the test's own, for which the server listens anew on the same port; a
# client that connects again before that listen is rejected (no listener, reason 8) as on
# any rdma_cm stack. Debian's perftest 4.5 does not retry (newer perftest tries 10 times);
# with freeflow's polling waits its client wins the race in about 1 run of 5 (measured:
# 9 of 48 on one node, 4 of 12 across nodes; none of 36 with FFV_SPIN_US=0 --spin-us 0).
# Across nodes on the direct path, whose exchange is faster, ib_read_lat's client lost it in
# about half the runs (5 in a row once in 6 sets), so the pair runs up to 10 times, as newer
# perftest retries itself; a lost run costs well under a second (cm_pair stops its server)
# and a pause before the next (0.3 s more each time, 13.5 s at most in all).
again_if_perftest_raced() {
  local st attempt
  for ((attempt = 1; attempt <= 10; attempt++)); do
    "$@"
    st=$?
    { [[ $st -ne 0 && $case == ib_* ]] && listened_again &&
      perftest_lost_race "$FF_DIR"/client.{log,err}; } || break
    echo "perftest's client connected for its test before its server listened again (run $attempt); running the pair again"
    # After a pause that grows: one make test lost all ten runs in a row, back to back,
    # while the kernel was still tearing down earlier tests' namespaces; alone it wins.
    sleep "$(awk -v a="$attempt" 'BEGIN { printf "%.1f", 0.3 * a }')"
  done
  return $st
}

# pair_and NAME CHECK -- PAIR ARGS...: cm_pair, then the shell CHECK on its logs.
pair_and() {
  local name=$1 chk=$2
  shift 3
  again_if_perftest_clock_failed again_if_perftest_raced cm_pair "$@"
  local st=$?
  [[ $st -eq 0 ]] && { eval "$chk" || { st=1; logs 8; }; }
  check "$name" $st
}

C=$FF_DIR/client.log SV=$FF_DIR/server.log
# perftest's result line: size, iterations, figures.
PT_LINE='^ +[0-9]+ +1000 +[0-9.]+'
# rstream/riostream's (custom test): name, size 4k, 1k transfers, 1 iteration, total, time, Gb/sec.
RS_LINE='^custom +4k +1k +1 +[0-9.]+[kmg]? +[0-9.]+s +[0-9.]+ +[0-9.]+$'

# udpong's result line (custom test, echo): name, size 1k, 2k transfers (each of the 1000
# messages there and back), total, time, Gb/sec, usec/xfer.
UP_LINE='^custom +1k +2k +[0-9.]+[kmg]? +[0-9.]+s +[0-9.]+ +[0-9.]+$'

# pod0_bound u|t PORT PID: 0 once a UDP (u) or TCP listening (t) socket on PORT shows in pod
# 0's network namespace, within 5 s and while PID lives; 1 otherwise.
pod0_bound() {
  local i
  for ((i = 0; i < 100; i++)); do
    ip netns exec "$(ff_pod_ns 0)" ss -Hl"$1"n "sport = :$2" | grep -q . && return 0
    kill -0 "$3" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}

# udpong_pair: udpong (rsockets over UD QPs) between the pods, in its echo mode: every
# datagram is answered, so none is lost by design (its bandwidth tests, the default run,
# send without flow control and count the datagrams that the server's receive queue
# dropped). udpong waits for each answer with rpoll and a 1 ms timeout, and Debian's
# librdmacm (44.0) leaks a count in rpoll each time that timeout expires (rs_poll_enter
# before the timeout check, which returns without rs_poll_exit); from the next poll on,
# rpoll no longer times out and only returns when a datagram comes. A datagram lost after
# that hangs the program on any RDMA stack, not only this one (docs/router.md). The server
# only binds a UDP socket (no rdma_cm listen) and never exits: the client starts once the
# port is bound, and the server must still be alive when the client has finished.
udpong_pair() {
  local port=7174 c
  pod_bg 0 stdbuf -oL udpong -b "$S" -p $port >"$SV" 2>"$FF_DIR/server.err"
  local spid=$FF_LAST_PID
  if ! pod0_bound u "$port" "$spid"; then
    kill "$spid" 2>/dev/null
    echo "the udpong server did not bind within 5 s"
    logs
    return 1
  fi
  pod_run 1 timeout 60 stdbuf -oL udpong -s "$S" -p $port -T e -C 1000 -S 1024 \
    >"$C" 2>"$FF_DIR/client.err"
  c=$?
  if ! kill -0 "$spid" 2>/dev/null; then
    wait "$spid"
    echo "the udpong server exited (status $?) while serving"
    c=1
  fi
  kill "$spid" 2>/dev/null
  wait "$spid" 2>/dev/null
  [[ $c -eq 0 ]] || { echo "client exit $c"; logs; return 1; }
  { has "$C" "$UP_LINE" 1 && has "$SV" "^client login from $(ff_pod_ip 1)\$" 1; } || { logs 8; return 1; }
}

# fi_pair NAME LAST_SIZE PORT ARGS...: libfabric's fi_pingpong between the pods, with ARGS
# (its provider and endpoint type, 100 verified round trips a size). The two meet over
# fi_pingpong's own TCP control port (PORT) first, so the client starts once the server
# listens there. Both must exit 0 and print their LAST_SIZE line with 100 round trips.
fi_pair() {
  local name=$1 last=$2 port=$3 c s st=1
  shift 3
  pod_bg 0 stdbuf -oL fi_pingpong "$@" -I 100 -c -B "$port" >"$SV" 2>"$FF_DIR/server.err"
  local spid=$FF_LAST_PID
  if ! pod0_bound t "$port" "$spid"; then
    kill "$spid" 2>/dev/null
    echo "fi_pingpong's server did not listen on its control port within 5 s"
    logs
    check "$name" 1
    return
  fi
  pod_run 1 timeout 60 stdbuf -oL fi_pingpong "$@" -I 100 -c -P "$port" "$S" >"$C" \
    2>"$FF_DIR/client.err"
  c=$?
  wait_pid "$spid" 30
  s=$?
  if [[ $c -ne 0 || $s -ne 0 ]]; then
    echo "client exit $c, server exit $s"
    logs
  elif has "$C" "^$last +100 +=100 " 1 && has "$SV" "^$last +100 +=100 " 1; then
    st=0
  else
    logs 8
  fi
  check "$name" $st
}

# connected_then_kill WHAT: cm_errors server in pod 0 and a client in pod 1, connected; then
# the server's process (peer) or pod 0's router (router) is killed and the client, and for
# the router the server too, must see their event within CM_BOUND s: DISCONNECTED for the
# client when its peer is gone (process, or the router of another node), DEVICE_REMOVAL for
# a pod whose own router is gone.
connected_then_kill() {
  local port=7410 mode=hold client=client
  [[ $1 == router ]] && port=7420 mode=removal client=wait-removal
  [[ $1 == router && $where == cross ]] && client=client
  pod_bg 0 "$CM_ERRORS" server $port $mode >"$SV" 2>&1
  local spid=$FF_LAST_PID
  wait_line "$SV" '^LISTENING' 10 "$spid" || { logs; return 1; }
  pod_bg 1 "$CM_ERRORS" $client "$S" $port >"$C" 2>&1
  local cpid=$FF_LAST_PID c s=0
  { wait_line "$C" '^ESTABLISHED' 10 "$cpid" && wait_line "$SV" '^ESTABLISHED' 5 "$spid"; } || { logs; return 1; }
  if [[ $1 == peer ]]; then
    kill -KILL "$spid"
    wait "$spid" 2>/dev/null
  else
    pod_router_kill 0 KILL
  fi
  wait_pid "$cpid" "$CM_BOUND"
  c=$?
  [[ $1 == router ]] && { wait_pid "$spid" "$CM_BOUND"; s=$?; }
  echo "--- client (exit $c)"; cat "$C"
  [[ $1 == router ]] && { echo "--- server (exit $s)"; cat "$SV"; }
  [[ $c -eq 124 || $s -eq 124 ]] && echo "no event within $CM_BOUND s of the kill"
  [[ $c -eq 0 && $s -eq 0 ]]
}

# router_replaced: as connected_then_kill router, then pod 0's router is started again: the
# same two processes (cm_errors server ... reopen, cm_errors reopen) must connect again, the
# client retrying while the device or the server's new listener is not back.
router_replaced() {
  local port=7440 want=removal c s
  [[ $where == cross ]] && want=disconnected
  pod_bg 0 "$CM_ERRORS" server $port reopen >"$SV" 2>"$FF_DIR/server.err"
  local spid=$FF_LAST_PID
  wait_line "$SV" '^LISTENING' 10 "$spid" || { logs; return 1; }
  pod_bg 1 "$CM_ERRORS" reopen "$S" $port $want >"$C" 2>"$FF_DIR/client.err"
  local cpid=$FF_LAST_PID
  { wait_line "$C" '^ESTABLISHED' 10 "$cpid" && wait_line "$SV" '^ESTABLISHED' 5 "$spid"; } || { logs; return 1; }
  pod_router_kill 0 KILL
  pod_router_start 0 || return 1
  wait_pid "$cpid" 120
  c=$?
  wait_pid "$spid" 30
  s=$?
  echo "--- client (exit $c)"; cat "$C"
  echo "--- server (exit $s)"; cat "$SV"
  [[ $c -eq 0 && $s -eq 0 ]] && has "$C" '^ok connected again in the same process ' 1 &&
    has "$SV" '^ok accepted again in the same process' 1
}

case $case in
  rping)
    pair_and "rping -C 1000 -V" "has $C '^ping data: rdma-ping-[0-9]+: ' 1000 && has $C '^ping data: rdma-ping-999: '" \
      -- rping -s -V -C 1000 -- rping -c -a "$S" -C 1000 -v -V
    ;;
  ucmatose)
    pair_and "ucmatose, 4 connections" \
      "has $SV '^data transfers complete' && has $C '^data transfers complete' && has $SV '^return status 0' && has $C '^return status 0'" \
      -- ucmatose -c 4 -- ucmatose -s "$S" -c 4
    ;;
  udaddy)
    done_ok="has $SV '^data transfers complete' && has $C '^data transfers complete' && has $SV '^return status 0' && has $C '^return status 0'"
    pair_and "udaddy" "$done_ok" -- udaddy -- udaddy -s "$S"
    # 100 datagrams of 1 KiB each way: the server exits right after its replies, which
    # must still all arrive (across nodes some waited for room at the client's router).
    CM_CLIENT_BOUND=20
    pair_and "udaddy, 100 x 1 KiB each way, the server gone right after its replies" "$done_ok" \
      -- udaddy -C 100 -S 1024 -- udaddy -s "$S" -C 100 -S 1024
    ;;
  rdma_server)
    pair_and "rdma_server / rdma_client" "has $SV '^rdma_server: end 0$' && has $C '^rdma_client: end 0$'" \
      -- rdma_server -- rdma_client -s "$S"
    ;;
  rdma_xserver)
    pair_and "rdma_xserver / rdma_xclient (RC)" \
      "has $SV '^rdma_xserver: end 0$' && has $C '^rdma_xclient: end 0$'" \
      -- rdma_xserver -c r -- rdma_xclient -s "$S" -c r
    ;;
  cmtime)
    # Connections set up at once on one channel, each step for all of them together; a
    # connection that fails prints its event and the run goes on, so none may show. Across
    # nodes each connection is a cross-node channel of the pod's router, of which a pod may
    # hold 64 by default (--max-proxies-per-pod, docs/security.md): 50 there, 200 on one node.
    n=200
    [[ $where == cross ]] && n=50
    CM_SERVER_STAYS=1
    pair_and "cmtime, $n connections at once" \
      "has $C '^connect +: +[0-9.]+ ' 1 && has $C '^disconnect +: ' 1 && ! has $C '^event: ' >/dev/null" \
      -- cmtime -p 7280 -- cmtime -s "$S" -p 7280 -c $n
    ;;
  rcopy)
    head -c 3000000 /dev/urandom >"$FF_DIR/rcopy.src"
    CM_SERVER_STAYS=1
    pair_and "rcopy, a 3 MB file" "cmp $FF_DIR/rcopy.src $FF_DIR/rcopy.dst" \
      -- rcopy -p 7290 -- rcopy "$FF_DIR/rcopy.src" "$S:$FF_DIR/rcopy.dst" -p 7290  # the file first
    ;;
  rstream | riostream)
    CM_CLIENT_BOUND=20 CM_SERVER_BOUND=10  # a run takes under a second
    pair_and "$case (rsockets), 1000 x 4 KiB each way, verified" "has $C '$RS_LINE' 1 && has $SV '$RS_LINE' 1" \
      -- "$case" -S 4096 -C 1000 -T v -- "$case" -s "$S" -S 4096 -C 1000 -T v
    ;;
  udpong)
    udpong_pair
    check "udpong (rsockets over UD), 1000 x 1 KiB echoed" $?
    ;;
  ib_send_bw | ib_write_bw | ib_read_lat)
    pair_and "$case -R" "has $C '$PT_LINE'" -- "$case" -R -n 1000 -- "$case" -R -n 1000 "$S"
    ;;
  ucp-sockaddr)
    # UCX's client/server API (ucp_listener_create, ucp_ep_create with a socket address)
    # connects through UCX's rdmacm connection manager, which cm_pair sees listen at the
    # router; then 1 MiB goes over rc_verbs and its sum comes back. UCX_TLS leaves out the
    # shared memory and TCP transports that pods on one kernel could use instead.
    ucx=(env UCX_TLS=rc_v UCX_NET_DEVICES=freeflow0:1 UCX_SOCKADDR_TLS_PRIORITY=rdmacm)
    CM_CLIENT_BOUND=60 CM_SERVER_BOUND=30
    pair_and "UCX client/server over rdma_cm (ucp_listener / sockaddr endpoint), 1 MiB and its sum" \
      "has $SV '^request from $(ff_pod_ip 1)\$' 1 && has $SV '^server got 1048576 bytes, sum [0-9]+\$' 1 && has $C '^client got sum [0-9]+\$' 1 && has $SV '^server done\$' 1 && has $C '^client done\$' 1" \
      -- "${ucx[@]}" "$UCP_SOCKADDR" server 7450 -- "${ucx[@]}" "$UCP_SOCKADDR" client "$S" 7450
    ;;
  libfabric)
    # libfabric's verbs provider: connected endpoints (FI_EP_MSG), which connect through
    # rdma_cm; reliable datagrams over them (ofi_rxm); and its UD endpoints (FI_EP_DGRAM),
    # whose addresses carry GID index 0 of the port.
    fi_pair "libfabric verbs msg endpoints (rdma_cm), 64 B..1 MiB, verified" 1m 47600 -p verbs -e msg
    fi_pair "libfabric verbs;ofi_rxm rdm endpoints, 64 B..1 MiB, verified" 1m 47601 -p "verbs;ofi_rxm" -e rdm
    fi_pair "libfabric verbs dgram endpoints (UD, GID index 0), 64 B..4 KiB, verified" 4k 47602 -p verbs -e dgram
    ;;
  noconn)
    # A pod where no program uses rdma_cm, then one that listens on another port.
    pod_run 1 timeout 20 "$CM_ERRORS" noconn "$S" 7400
    check "connect to a pod that runs nothing: REJECTED/UNREACHABLE within 1 s" $?
    pod_bg 0 "$CM_ERRORS" server 7401 hold >"$SV" 2>&1
    if wait_line "$SV" '^LISTENING' 10 "$FF_LAST_PID"; then
      pod_run 1 timeout 20 "$CM_ERRORS" noconn "$S" 7402
    else
      cat "$SV"
      false
    fi
    check "connect to a port nobody listens on (the pod listens on another): REJECTED/UNREACHABLE within 1 s" $?
    ;;
  badaddr)
    # Outside VNET_PREFIX (10.244.0.0/16): far from it, and just past its end.
    for a in 192.0.2.1 10.245.0.10; do
      pod_run 1 timeout 20 "$CM_ERRORS" badaddr "$a"
      check "resolve $a (outside the virtual network): ADDR_ERROR" $?
    done
    ;;
  mckey)
    # freeflow has no multicast: a group address resolves (as on a RoCE device) and the
    # join fails at once with EOPNOTSUPP, said in the program's own output; as receiver
    # (pod 0) and as sender (pod 1), each within 5 s.
    for i in 0 1; do
      mode=(); [[ $i == 1 ]] && mode=(-s)
      t0=$(now_ms)
      pod_run "$i" timeout 20 mckey -m 239.1.1.1 -b "$(ff_pod_ip "$i")" "${mode[@]}" \
        >"$FF_DIR/mckey.log" 2>&1
      st=$? took=$(($(now_ms) - t0))
      has "$FF_DIR/mckey.log" '^mckey: failure joining: Operation not supported$' 1 &&
        has "$FF_DIR/mckey.log" '^freeflow error\[[0-9]*\]: rdma_join_multicast: freeflow has no multicast' 1 &&
        [[ $st -ne 0 && $st -ne 124 && $took -lt 5000 ]]
      ok=$?
      [[ $ok -ne 0 ]] && { echo "mckey exit $st after $took ms:"; cat "$FF_DIR/mckey.log"; }
      check "mckey ${mode[*]:-(receiver)}: the join fails with EOPNOTSUPP within 5 s" $ok
    done
    ;;
  both-disconnect)
    # Both sides disconnect as soon as they are connected, so that their DREQs cross (and
    # the passive side's library writes DISCONNECTED while the router's is queued).
    pair_and "both sides disconnect at once, 50 connections: one DISCONNECTED each, nothing after" \
      "has $SV '^ok both-disconnect: 50 ' 1 && has $C '^ok both-disconnect: 50 ' 1" \
      -- "$CM_ERRORS" both-server 7430 50 -- "$CM_ERRORS" both-client "$S" 7430 50
    ;;
  fork)
    # A client that connected forks: the child's librdmacm still lists the parent's device
    # (index 0), its own session is a new index, and it must connect on that one.
    pair_and "a forked child connects on a device of its own, then the parent again" \
      "has $C '^ok parent connected on device index 0' 1 && has $C '^ok child connected on device index 1' 1 && has $C '^ok parent again connected on device index 0' 1 && has $SV '^ok both-disconnect: 3 ' 1" \
      -- "$CM_ERRORS" both-server 7440 3 -- "$CM_ERRORS" fork-client "$S" 7440
    ;;
  peer-killed)
    connected_then_kill peer
    check "server process killed: the client gets DISCONNECTED within $CM_BOUND s" $?
    ;;
  router-killed)
    connected_then_kill router
    st=$?
    if [[ $where == cross ]]; then
      check "the server's router killed: the server gets DEVICE_REMOVAL, the client on the other node DISCONNECTED, within $CM_BOUND s" $st
    else
      check "router killed: client and server get DEVICE_REMOVAL within $CM_BOUND s" $st
    fi
    ;;
  router-replaced)
    router_replaced
    check "router killed and started again: the same processes connect again" $?
    ;;
  *)
    echo "unknown case $case"
    exit 2
    ;;
esac
[[ $failures -eq 0 ]]
