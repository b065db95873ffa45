#!/usr/bin/env bash
# Integration (issue 41): a router started with --take-over beside the router of a node takes
# its pods over while they run traffic (docs/handover.md): verbs, rdma_cm, UCX and TCP mode.
# The programs that ran across the hand-over must finish without an error, and the pause
# each saw is printed beside the router's own (pauses_of; a ping-pong's longest iteration in
# a hand-over of its own); new programs must work with the successor, which holds nothing
# once they exit. Each router's
# --ready-file exists while it, and no other, serves. The hand-over socket refuses a process
# that is not a router of this node (unprivileged, without CAP_SYS_ADMIN, in a pod), and a
# router of hand-over versions that cannot carry what the old one holds; a hostile pod
# gains nothing from the hand-over. (A refusal by a real successor, and one that waits:
# tests/integration/multinode/handover.sh.)
set -uo pipefail
source "$(dirname "$0")/../../../scripts/lib/cluster.sh"
export FF_ROUTER_LOG=info
NEW_PID=""
# Programs that report at their exit the longest their send queues waited (send_waits.h).
W=(env FFV_REPORT_WAITS=1)
stop_successor() { [[ -z $NEW_PID ]] || { kill "$NEW_PID" 2>/dev/null; wait "$NEW_PID" 2>/dev/null; NEW_PID=""; }; }
trap 'stop_successor; cluster_down' EXIT
cluster_up 3
# Every router serves /metrics on the node's port: a successor binds it once the old router
# has given it up (the end of the hand-over connection says so).
METRICS=127.0.0.1:19478
router_up --ready-file "$FF_DIR/ready-1" --metrics-address "$METRICS" || exit 1
S=$(ff_pod_ip 0)
SOCKET_NAME="freeflow-handover:$FF_DIR/ffrouter"
failures=0
result() {  # result NAME STATUS
  if [[ $2 -eq 0 ]]; then echo "PASS $1"; else echo "FAIL $1"; failures=$((failures + 1)); fi
}

# successor N [ARGS...]: router N on the node's folder with --take-over (and ARGS), its pid
# in NEW_PID, logging to routerN.log, its ready file ready-N; 0 once it says it took over and
# its ready file names it, 1 when it exited first or did not get there in 15 s.
successor() {
  local n=$1 i
  shift
  ip netns exec "$FF_NODE" "$FF_BUILD/router/ffrouter" --dir "$FF_DIR" --name ffrouter \
    --vnet-prefix 10.244.0.0/16 --log-level info --take-over --ready-file "$FF_DIR/ready-$n" \
    --metrics-address "$METRICS" "$@" >>"$FF_DIR/router$n.log" 2>&1 &
  NEW_PID=$!
  for ((i = 0; i < 300; i++)); do
    # It logs "took over" before it serves and writes its ready file.
    grep -q "took over" "$FF_DIR/router$n.log" &&
      [[ $(cat "$FF_DIR/ready-$n" 2>/dev/null) == "$NEW_PID" ]] && return 0
    if ! kill -0 "$NEW_PID" 2>/dev/null; then
      NEW_PID=""
      return 1
    fi
    sleep 0.05
  done
  return 1
}

# send_pair PORT NAME: a new ib_send_bw pair between pods 0 and 1 (logs NAME-s, NAME-c);
# 0 when both exit 0.
send_pair() {
  local sp c
  pod_bg 0 ib_send_bw -n 1000 -p "$1" >"$FF_DIR/$2-s.log" 2>&1
  sp=$FF_LAST_PID
  sleep 0.3
  pod_run 1 timeout 30 ib_send_bw -n 1000 -p "$1" "$S" >"$FF_DIR/$2-c.log" 2>&1
  c=$?
  wait_pid "$sp" 10 && [[ $c -eq 0 ]]
}

# knock NETNS [setpriv ARGS...]: a process in NETNS (with setpriv's restrictions) connects
# to the hand-over socket and says what a successor would not; prints what it got back.
knock() {
  local ns=$1
  shift
  ip netns exec "$ns" setpriv "$@" /usr/bin/python3 - "$SOCKET_NAME" <<'EOF'
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
try:
    s.connect('\0' + sys.argv[1])
except OSError as e:
    print('connect refused:', e.strerror)
    sys.exit(0)
s.settimeout(5)
try:
    s.send(b'\x01' * 64)
    print('got', len(s.recv(65536)), 'bytes')
except OSError as e:  # closed before or after what it sent: nothing either way
    print('got an error:', e.strerror)
EOF
}

# tcp POD CMD...: CMD in pod POD in TCP mode (libfsocket.so preloaded), in the background;
# its pid in TCP_PID.
tcp() {
  local i=$1
  shift
  ip netns exec "$(ff_pod_ns "$i")" env LD_PRELOAD="$FF_BUILD/fsocket/libfsocket.so" FFR_NAME=ffrouter \
    FREEFLOW_DIR="$FF_DIR" VNET_PREFIX=10.244.0.0/16 "$@" &
  TCP_PID=$!
  FF_PIDS+=("$TCP_PID")
}

# hello LOWEST HIGHEST: a router of the node (root, every capability) asks for the state,
# speaking hand-over versions LOWEST-HIGHEST; prints the answer's type and text.
hello() {
  ip netns exec "$FF_NODE" /usr/bin/python3 - "$SOCKET_NAME" "$1" "$2" <<'EOF'
import socket, struct, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.connect('\0' + sys.argv[1])
s.settimeout(10)
s.send(struct.pack('<IIQQ', 0x46464856, 1, int(sys.argv[2]), int(sys.argv[3])))
m = s.recv(65536)
kind = {2: 'refused', 3: 'accepted'}.get(struct.unpack('<I', m[4:8])[0], 'other')
print(kind + ':', m[24:].decode(errors='replace'))
EOF
}

# 2. Processes that are not a router of this node knock at the hand-over socket: refused,
#    given nothing, the router serving on.
out=$(knock "$FF_NODE" --reuid=65534 --regid=65534 --clear-groups)
echo "unprivileged: $out"
[[ $out == "got 0 bytes" || $out == "got an error"* ]]
result "an unprivileged process of the node's namespace gets nothing from the hand-over socket" $?
out=$(knock "$FF_NODE" --bounding-set=-sys_admin)
echo "root without CAP_SYS_ADMIN: $out"
[[ $out == "got 0 bytes" || $out == "got an error"* ]]
result "root without CAP_SYS_ADMIN gets nothing from the hand-over socket" $?
out=$(knock "$(ff_pod_ns 2)")
echo "a pod: $out"
[[ $out == "connect refused"* ]]
result "a pod cannot reach the hand-over socket" $?
[[ $(grep -c "refused a connection to the hand-over socket" "$FF_DIR/router.log") -eq 2 ]] &&
  kill -0 "$FF_ROUTER_PID"
result "the router logged both refusals and serves on" $?

# 2b. Versions: a router that speaks only versions the old one does not is refused; one of
#     version 1 is refused while an rdma_cm id exists (version 2 carries them), one of
#     version 2 while a TCP-mode listener exists (version 3); the router serves on.
out=$(hello 90 99)
echo "versions 90-99: $out"
[[ $out == "refused: it speaks hand-over versions 1-4" ]]
result "a successor of hand-over versions the router does not speak is refused" $?
pod_bg 0 rping -s -a "$S" -p 7301 -C 1 >"$FF_DIR/rping1.log" 2>&1
rping_pid=$FF_LAST_PID
wait_line "$FF_DIR/router.log" "rdma_cm listens on $S:7301" 5 "$rping_pid"
out=$(hello 1 1)
echo "version 1 beside an rdma_cm listener: $out"
kill "$rping_pid" 2>/dev/null
wait "$rping_pid" 2>/dev/null
[[ $out == "refused: it holds rdma_cm ids (hand-over version 2 carries them)" ]] && send_pair 18613 versions
result "a successor of version 1 is refused rdma_cm ids, and the router serves on" $?
tcp 0 iperf3 -s -1 -B "$S" -p 7400 >"$FF_DIR/tcp0.log" 2>&1
wait_listen 0 "$TCP_PID" 7400
out=$(hello 1 2)
echo "versions 1-2 beside a TCP-mode listener: $out"
kill "$TCP_PID" 2>/dev/null
wait "$TCP_PID" 2>/dev/null
[[ $out == "refused: it serves TCP-mode sessions (hand-over version 3 carries them)" ]] &&
  send_pair 18614 versions2
result "a successor of versions 1-2 is refused TCP mode, and the router serves on" $?

# 2c. A successor whose import fails after the state came: configured with another pod
#     network, it refuses the sessions of addresses outside it and exits; the old router
#     serves on with what it had (the pair running across the attempt finishes, a new one
#     connects), and its ready file stays.
pod_bg 0 ib_send_bw -D 4 -p 18615 >"$FF_DIR/failed-s.log" 2>&1
fs=$FF_LAST_PID
sleep 0.3
pod_bg 1 ib_send_bw -D 4 -p 18615 "$S" >"$FF_DIR/failed-c.log" 2>&1
fc=$FF_LAST_PID
sleep 1
ip netns exec "$FF_NODE" timeout 30 "$FF_BUILD/router/ffrouter" --dir "$FF_DIR" --name ffrouter \
  --vnet-prefix 10.245.0.0/16 --log-level info --take-over --ready-file "$FF_DIR/ready-x" \
  >"$FF_DIR/router-x.log" 2>&1
st=$?
grep -E "error|the hand-over failed" "$FF_DIR/router-x.log" "$FF_DIR/router.log" | sed 's/.*ffrouter: //'
wait_pid "$fs" 20 && wait_pid "$fc" 20
pair=$?
[[ $st -ne 0 && $pair -eq 0 && -e $FF_DIR/ready-1 && ! -e $FF_DIR/ready-x ]] &&
  grep -q "state is refused: a session's address 10.244.* is outside this router's overlay 10.245.0.0/16" \
    "$FF_DIR/router-x.log" &&
  grep -q "the hand-over failed (a session's address" "$FF_DIR/router.log" &&
  send_pair 18616 after-failed
result "a successor that refuses the state (another overlay) exits; the router serves on" $?

# 3. The hand-over under traffic: a stream and a ping-pong between two pods run across it.
OLD_PID=$FF_ROUTER_PID
# rdma_cm first: a connected pair (perftest over rdma_cm, -R, 8 s: it starts before the
# others) and a listener whose client comes only after the hand-over.
pod_bg 0 rping -s -a "$S" -p 7300 -C 10 -V >"$FF_DIR/rping-s.log" 2>&1
rpings=$FF_LAST_PID
# The perftest pair's client only once its server listens (perftest's client gives up at a
# connect rejected before), and again when it loses perftest's own race (perftest_cm_pair).
# Any other way of failing fails the test.
cm_server() { pod_bg 0 "${W[@]}" ib_read_lat -R -D 8 -p 18602 >"$FF_DIR/cm-s.log" 2>&1; }
cm_client() { pod_bg 1 "${W[@]}" ib_read_lat -R -D 8 -p 18602 "$S" >"$FF_DIR/cm-c.log" 2>&1; }
perftest_cm_pair "$FF_DIR/router.log" "$S:18602" "$FF_DIR/cm-c.log" cm_server cm_client
cms=$CM_S cmc=$CM_C
pod_bg 0 ib_write_bw -D 20 -p 18600 >"$FF_DIR/bw-s.log" 2>&1
bws=$FF_LAST_PID
pod_bg 0 "${W[@]}" ib_send_lat -D 6 -p 18601 >"$FF_DIR/lat-s.log" 2>&1
lats=$FF_LAST_PID
sleep 0.3
pod_bg 1 "${W[@]}" ib_write_bw -D 20 -p 18600 "$S" >"$FF_DIR/bw-c.log" 2>&1
bwc=$FF_LAST_PID
pod_bg 1 "${W[@]}" ib_send_lat -D 6 -p 18601 "$S" >"$FF_DIR/lat-c.log" 2>&1
latc=$FF_LAST_PID
pod_bg 2 "$FF_CONTROL_PAUSE" 6 >"$FF_DIR/pause.log" 2>&1
pause=$FF_LAST_PID
wait_line "$FF_DIR/router.log" "rdma_cm listens on $S:7300" 5 "$rpings"
sleep 1
running=0
for p in $bws $lats $bwc $latc $pause $cms $cmc $rpings; do kill -0 "$p" 2>/dev/null && running=$((running + 1)); done
# Which program is gone, when one is, and what it said last.
names=(bw-s lat-s bw-c lat-c pause cm-s cm-c rping-s)
pids=("$bws" "$lats" "$bwc" "$latc" "$pause" "$cms" "$cmc" "$rpings")
for i in "${!pids[@]}"; do
  kill -0 "${pids[$i]}" 2>/dev/null || echo "${names[$i]} exited before the hand-over: $(tail -n 2 "$FF_DIR/${names[$i]}.log" | tr '\n' ' ')"
done
rm -f "$FF_DIR/router2.log"
successor 2
st=$?
grep "handed over to a successor" "$FF_DIR/router.log" | sed 's/.*info ffrouter: //'
[[ $st -eq 0 && $running -eq 8 ]]
result "a successor took over while 8 programs ran (their QPs, MRs, CQs and rdma_cm ids)" $?
[[ $(cat "$FF_DIR/ready-2" 2>/dev/null) == "$NEW_PID" && ! -e $FF_DIR/ready-1 ]]
result "the ready file moved with the pods: the successor's written, the old router's removed" $?
ip netns exec "$FF_NODE" curl -sf --max-time 5 "http://$METRICS/metrics" | grep -q '^freeflow_router_build_info{'
result "the successor serves the node's metrics port, which the old router gave up first" $?
kill -TERM "$OLD_PID"
wait_pid "$OLD_PID" 10
result "the old router exits 0 on SIGTERM once handed over" $?
FF_ROUTER_PID=$NEW_PID
NEW_PID=""
ok=0
pod_run 1 timeout 20 rping -c -a "$S" -p 7300 -C 10 -V >"$FF_DIR/rping-c.log" 2>&1
rc=$?
for p in $bws $lats $bwc $latc $pause $cms $cmc $rpings; do wait_pid "$p" 30 || ok=1; done
for f in bw-c lat-c cm-c; do grep -E '^ +[0-9]+ +[0-9]+ ' "$FF_DIR/$f.log"; done
cat "$FF_DIR/pause.log"
echo "the pause each program saw (the old router $(grep -oh "paused [0-9]* ms" "$FF_DIR/router.log" | tail -n 1); goal: under 100 ms):"
FF_HANDOVER_WINDOW=$(handover_window "$FF_DIR/router.log")
pauses_of "ib_write_bw -D 20 (client)" "waits:$FF_DIR/bw-c.log"
pauses_of "ib_send_lat" "client=waits:$FF_DIR/lat-c.log" "server=waits:$FF_DIR/lat-s.log"
pauses_of "ib_read_lat over rdma_cm" "client=waits:$FF_DIR/cm-c.log" "server=waits:$FF_DIR/cm-s.log"
[[ $ok -eq 0 && $rc -eq 0 ]] && ! grep -qiE "fail|error|unable" "$FF_DIR"/{bw,lat,cm,rping}-{s,c}.log &&
  grep -q ", 0 failed, longest" "$FF_DIR/pause.log"
result "every program that ran across the hand-over finished without an error" $?

# 4. The successor serves new programs, and what the old ones held was released on it.
send_pair 18611 after
result "new programs work with the successor" $?
line=$(router_stats_line "$FF_ROUTER_PID" "$FF_DIR/router2.log")
echo "successor: $line"
held=""
for k in qps regions cm_ids accounts; do grep -qE " $k=0 " <<<"$line" || held+=" $k"; done
[[ -z $held ]] && grep -qE '(^| )sessions=0 ' <<<"$line"
result "the successor holds nothing once every program exited" $?

# 5. UCX and TCP mode across a hand-over: ucx_perftest tag_lat over rc_verbs, an iperf3 in
#    TCP mode (its connection's record, segment and bells move), and a TCP-mode listener
#    whose client connects only after it.
UCX=(env FFV_REPORT_WAITS=1 UCX_TLS=rc_v UCX_NET_DEVICES=freeflow0:1)
pod_bg 0 "${UCX[@]}" timeout 60 ucx_perftest -p 13400 >"$FF_DIR/ucx-s.log" 2>&1
ucxs=$FF_LAST_PID
wait_listen 0 "$ucxs" 13400
pod_bg 1 "${UCX[@]}" timeout 60 ucx_perftest "$S" -p 13400 -t tag_lat -n 6000000 -f >"$FF_DIR/ucx-c.log" 2>&1
ucxc=$FF_LAST_PID
tcp 0 iperf3 -s -1 -B "$S" -p 7401 -J >"$FF_DIR/iperf-s.json" 2>"$FF_DIR/iperf-s.err"
ips=$TCP_PID
wait_listen 0 "$ips" 7401
iperf_at=$(date +%s.%N)
tcp 1 timeout 30 iperf3 -c "$S" -p 7401 -t 6 -i 0.1 -J >"$FF_DIR/iperf-c.json" 2>"$FF_DIR/iperf-c.err"
ipc=$TCP_PID
tcp 0 iperf3 -s -1 -B "$S" -p 7402 -J >"$FF_DIR/iperf2-s.json" 2>"$FF_DIR/iperf2-s.err"
ips2=$TCP_PID
wait_listen 0 "$ips2" 7402
sleep 2
OLD_PID=$FF_ROUTER_PID
before=$(router_stats_line "$OLD_PID" "$FF_DIR/router2.log" | grep -oE 'streams=[0-9]+ listeners=[0-9]+')
running=0
for p in $ucxc $ucxs $ips $ipc $ips2; do kill -0 "$p" 2>/dev/null && running=$((running + 1)); done
successor 3
st=$?
grep "handed over to a successor" "$FF_DIR/router2.log" | sed 's/.*info ffrouter: //'
echo "TCP mode on the old router before: $before"
[[ $st -eq 0 && $running -eq 5 && $before != "streams=0 listeners=0" ]]
result "a successor took over while UCX and TCP-mode programs ran (TCP-mode records and listeners)" $?
kill -TERM "$OLD_PID"
wait_pid "$OLD_PID" 10
result "the old router exits 0 on SIGTERM" $?
FF_ROUTER_PID=$NEW_PID
NEW_PID=""
tcp 1 timeout 20 iperf3 -c "$S" -p 7402 -t 1 -J >"$FF_DIR/iperf2-c.json" 2>"$FF_DIR/iperf2-c.err"
ipc2=$TCP_PID
ok=0
for p in $ucxc $ucxs $ipc $ips $ipc2 $ips2; do wait_pid "$p" 40 || ok=1; done
grep -E '^ +6000000 ' "$FF_DIR/ucx-c.log"
bytes=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["end"]["sum_received"]["bytes"])' "$FF_DIR/iperf-c.json" 2>/dev/null)
bytes2=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["end"]["sum_received"]["bytes"])' "$FF_DIR/iperf2-c.json" 2>/dev/null)
echo "iperf3 in TCP mode across the hand-over: ${bytes:-no} bytes; its listener's client after it: ${bytes2:-no} bytes"
echo "the pause each program saw (the old router $(grep -oh "paused [0-9]* ms" "$FF_DIR/router2.log" | tail -n 1); goal: under 100 ms):"
FF_HANDOVER_WINDOW=$(handover_window "$FF_DIR/router2.log")
pauses_of "ucx_perftest tag_lat over rc_v" "client=waits:$FF_DIR/ucx-c.log" "server=waits:$FF_DIR/ucx-s.log"
pauses_of "iperf3 in TCP mode (client)" "iperf3:$FF_DIR/iperf-c.json:$iperf_at"
[[ $ok -eq 0 && ${bytes:-0} -gt 0 && ${bytes2:-0} -gt 0 ]] && grep -qE '^ +6000000 ' "$FF_DIR/ucx-c.log" &&
  ! grep -qi error "$FF_DIR"/iperf*-[sc].err
result "ucx_perftest and both iperf3 pairs in TCP mode finished without an error" $?
line=$(router_stats_line "$FF_ROUTER_PID" "$FF_DIR/router3.log")
echo "successor: $(grep -oE 'sessions=[0-9]+|streams=[0-9]+ listeners=[0-9]+|accounts=[0-9]+' <<<"$line" | tr '\n' ' ')"

# 6. The successor trusts the old router's tables, not a pod's claims: a hostile pod that
#    skips the library attacks a victim (secrets in two regions, an RC and a UD QP) while
#    both are handed over to a fourth router (adversary finding 1: attach to the victim's
#    QPs, take its regions by guessed ids, before, across and after the hand-over). The
#    attack must get nothing, and the victim must keep every byte and its device.
RV=$FF_DIR/adversary
mkdir -p "$RV/attach"
pod_bg 0 "$FF_VICTIM" "$RV" >"$RV/victim.log" 2>&1
victim_pid=$FF_LAST_PID
for ((i = 0; i < 200; i++)); do
  [[ -e $RV/victim ]] || ! kill -0 "$victim_pid" 2>/dev/null && break
  sleep 0.05
done
# As a container's root sees the node: the folder read-only, no CAP_SYS_ADMIN, no library.
# shellcheck disable=SC2016  # expanded by the inner shell
ip netns exec "$(ff_pod_ns 2)" unshare --mount --propagation private \
  sh -c 'mount --bind -o ro "$0" "$0" && exec "$@"' "$FF_DIR" \
  setpriv --bounding-set -sys_admin --inh-caps -sys_admin -- \
  env FREEFLOW_DIR="$FF_DIR" FFR_NAME=ffrouter "$FF_ADVERSARY" attach "$RV" >"$RV/attach.log" 2>&1 &
apid=$!
FF_PIDS+=("$apid")
sleep 1  # its first attempts
OLD_PID=$FF_ROUTER_PID
successor 4
st=$?
kill -TERM "$OLD_PID"
wait_pid "$OLD_PID" 10 && [[ $st -eq 0 && -e $RV/victim ]] && kill -0 "$apid" 2>/dev/null
result "the victim's and the attacker's sessions were handed over to a fourth router mid-attack" $?
FF_ROUTER_PID=$NEW_PID
NEW_PID=""
for ((i = 0; i < 1200; i++)); do
  [[ -e $RV/attach/holding ]] || ! kill -0 "$apid" 2>/dev/null && break
  sleep 0.05
done
touch "$RV/attach/release"
wait_pid "$apid" 30
a=$?
grep -E "^(DEFENDED|BREACHED)" "$RV/attach.log"
[[ $a -eq 0 ]] && grep -q "^DEFENDED 1 " "$RV/attach.log" && ! grep -q "^BREACHED" "$RV/attach.log"
result "the attack got none of the victim's QPs or regions, from either router" $?
touch "$RV/victim.release"
wait_pid "$victim_pid" 10
v=$?
tail -n 1 "$RV/victim.log"
result "the victim kept every byte of its secrets and its device across the hand-over (exit $v)" $v

# 7. The pause a ping-pong sees: the router is replaced a fifth time while an ib_send_lat -n
#    runs between two pods, nothing else running. Its longest iteration (t_max) holds the
#    pause (a same-node SEND completes at once, so its send queues hardly wait: the
#    receiving side does), printed beside the old router's and the send queues' waits.
pod_bg 0 "${W[@]}" ib_send_lat -n 8000000 -p 18620 >"$FF_DIR/pp-s.log" 2>&1
pps=$FF_LAST_PID
wait_listen 0 "$pps" 18620
pod_bg 1 "${W[@]}" ib_send_lat -n 8000000 -p 18620 "$S" >"$FF_DIR/pp-c.log" 2>&1
ppc=$FF_LAST_PID
sleep 1
OLD_PID=$FF_ROUTER_PID
successor 5
st=$?
kill -0 "$ppc" 2>/dev/null && kill -0 "$pps" 2>/dev/null
running=$?
kill -TERM "$OLD_PID"
wait_pid "$OLD_PID" 10 && [[ $st -eq 0 && $running -eq 0 ]]
result "a fifth router took over while ib_send_lat ran, and the old one exits 0" $?
FF_ROUTER_PID=$NEW_PID
NEW_PID=""
wait_pid "$ppc" 60 && wait_pid "$pps" 10 && ! grep -qiE "fail|error" "$FF_DIR"/pp-{s,c}.log
st=$?
line=$(grep -E '^ +2 +8000000 ' "$FF_DIR/pp-c.log")
read -r _ _ t_min t_max t_typical _ <<<"$line"
echo "ib_send_lat 2 B between two pods, the router replaced meanwhile: t_typical ${t_typical:-?} us, t_min ${t_min:-?} us, t_max ${t_max:-?} us (the old router $(grep -oh "paused [0-9]* ms" "$FF_DIR/router4.log" | tail -n 1))"
FF_HANDOVER_WINDOW=$(handover_window "$FF_DIR/router4.log")
pauses_of "that ib_send_lat" "client=waits:$FF_DIR/pp-c.log" "server=waits:$FF_DIR/pp-s.log"
[[ $st -eq 0 && -n $line ]]
result "ib_send_lat ran across the hand-over without an error, its longest iteration printed" $?

echo "$((failures == 0 ? 1 : 0)) suites ok"
[[ $failures -eq 0 ]]
