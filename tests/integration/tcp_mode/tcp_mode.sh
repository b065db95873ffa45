#!/usr/bin/env bash
# Integration (issue 14): TCP mode (docs/tcp-mode.md). Unmodified socket programs between a
# server in pod 0 and a client in pod 1, two pods of one node (same) or of two nodes (cross),
# with libfsocket.so preloaded on both sides, or on one side only (mixed_*). One case a run,
# so that a failure names it:
#   tcp_mode.sh [--library PATH|none] same|cross iperf3|iperf3_p4|iperf3_R|sockperf_pp|
#               sockperf_tp|nginx_curl|redis|scp|short|socat_fork|backlog|ab|grpc|mixed_client|
#               mixed_server|
#               router_restart (same only)
# --library none runs every program plain: kernel TCP throughout, which checks the harness
# itself. Every case checks what its programs report (exit statuses, results, hashes) and
# where the bytes went: the client pod's veth counters must show that freeflow carried them
# (same node, the library on both sides) or that kernel TCP did (everything else); a library
# that silently falls back to kernel TCP fails the first.
set -uo pipefail
source "$(dirname "$0")/../../../scripts/lib/cluster.sh"
TM_LIB=$FF_BUILD/fsocket/libfsocket.so
if [[ ${1:-} == --library ]]; then
  TM_LIB=${2:?--library PATH or none}
  shift 2
fi
source "$FF_SRC/scripts/lib/tcp_mode.sh"
where=${1:?same or cross}
case=${2:?which case}
if [[ $TM_LIB != none && ! -f $TM_LIB ]]; then
  echo "FAIL no library at $TM_LIB (build the ffsocket target, or --library none)"
  exit 1
fi
[[ $TM_LIB != none ]] && TM_LIB=$(realpath "$TM_LIB")

failures=0
check() {  # check NAME STATUS: prints PASS or FAIL NAME, counts a failure; returns STATUS
  if [[ $2 -eq 0 ]]; then echo "PASS $1 ($where node)"; else echo "FAIL $1 ($where node)"; failures=$((failures + 1)); fi
  return "$2"
}
# The big files (1 GiB each) live in memory, not on the disk under /tmp.
BIG=$(mktemp -d /dev/shm/freeflow-tcp.XXXXXX)
trap 'tm_down; rm -rf "$BIG"' EXIT
# At info level the routers log their stats line on SIGUSR1 (tm_sock_asks).
FF_ROUTER_LOG=${FF_ROUTER_LOG:-info} FF_KNOWN_PODS=1 two_pods_up "$where" || exit 1
S=$(ff_pod_ip 0)
D=$FF_DIR/case  # the servers' configurations and every log
mkdir -p "$D"

# tail_logs FILE...: the ends of the given logs, after a failure.
tail_logs() {
  local f
  for f in "$@"; do
    echo "--- $(basename "$f")"
    tail -n 15 "$f" 2>/dev/null || echo "(none)"
  done
}

# carried NAME SERVER_HOW CLIENT_HOW WIRE PAYLOAD PERCENT: checks who carried PAYLOAD bytes
# that the programs report having moved, from WIRE, the bytes that crossed the client pod's
# veth meanwhile. Freeflow, when there is a library and both sides run it on one node: then
# WIRE is below PERCENT % of PAYLOAD (what is left there is the kernel connection's own
# traffic: set-up, bells, ACKs, end). Kernel TCP otherwise: WIRE is at least PAYLOAD.
carried() {
  local name=$1 wire=$4 payload=$5 pct=$6
  if ((payload <= 0)); then
    check "$name: the programs reported no bytes moved" 1
    return
  fi
  if [[ $TM_LIB != none && $where == same && $2 == lib && $3 == lib ]]; then
    ((wire * 100 < payload * pct))
    check "$name: carried by freeflow ($wire bytes on the client's veth for $payload of payload, < $pct%)" $?
  else
    ((wire >= payload))
    check "$name: carried by kernel TCP ($wire bytes on the client's veth for $payload of payload)" $?
  fi
}

# preloaded NAME PID HOW: with a library, checks that the server PID has it mapped (HOW lib)
# or not (plain): that the pod's programs run as the case means them to.
preloaded() {
  [[ $TM_LIB == none ]] && return 0
  local found=1
  grep -qF "$TM_LIB" "/proc/$2/maps" 2>/dev/null && found=0
  if [[ $3 == lib ]]; then check "$1 runs with the library" $found; else check "$1 runs without the library" $((!found)); fi
}

# stopped NAME PID: stops a server (tm_stop) and checks that SIGTERM ended it.
stopped() {
  tm_stop "$2" 5
  check "$1 ends on SIGTERM within 5 s" $?
}

# iperf NAME SERVER_HOW CLIENT_HOW ARGS...: iperf3 server in pod 0, client in pod 1 with
# ARGS, both with JSON output: both exit 0, neither reports an error, bytes were received.
iperf() {
  local name=$1 sh=$2 ch=$3 port=5201 w0 c s bytes err
  shift 3
  tm_bg 0 "$sh" iperf3 -s -1 -B "$S" -p $port -J >"$D/iperf-s.json" 2>"$D/iperf-s.err"
  local spid=$FF_LAST_PID
  wait_listen 0 "$spid" $port || { check "$name: the iperf3 server listens" 1; tail_logs "$D"/iperf-s.*; return; }
  preloaded "iperf3 server" "$spid" "$sh"
  w0=$(tm_wire 1)
  tm_run 1 "$ch" timeout 30 iperf3 -c "$S" -p $port -J "$@" >"$D/iperf-c.json" 2>"$D/iperf-c.err"
  c=$?
  wait_pid "$spid" 10
  s=$?
  bytes=$(tm_json "$D/iperf-c.json" 'j["end"]["sum_received"]["bytes"]')
  err=$(tm_json "$D/iperf-c.json" 'j.get("error", "")')$(tm_json "$D/iperf-s.json" 'j.get("error", "")')
  [[ $c -eq 0 && $s -eq 0 && -z $err && ${bytes:-0} -gt 0 ]]
  check "$name: iperf3 $* moved ${bytes:-no} bytes (client exit $c, server exit $s${err:+, error: $err})" $?
  [[ $c -eq 0 && $s -eq 0 && -z $err ]] || tail_logs "$D"/iperf-{s,c}.{err,json}
  carried "$name" "$sh" "$ch" $(($(tm_wire_settled 1) - w0)) "${bytes:-0}" 1
}

# sockperf_pair NAME MODE PAYLOAD_CMD ARGS...: sockperf server in pod 0, `sockperf MODE`
# client in pod 1 (both with the library); PAYLOAD_CMD prints the bytes the client's log
# says it moved.
sockperf_pair() {
  local name=$1 mode=$2 payload_cmd=$3 port=11111 w0 c bytes
  shift 3
  SOCKPERF_WIRE=0 SOCKPERF_BYTES=0 SOCKPERF_EXIT=1
  tm_bg 0 lib sockperf sr --tcp -i "$S" -p $port >"$D/sockperf-s.log" 2>&1
  local spid=$FF_LAST_PID
  wait_listen 0 "$spid" $port || { check "$name: the sockperf server listens" 1; tail_logs "$D/sockperf-s.log"; return; }
  preloaded "sockperf server" "$spid" lib
  w0=$(tm_wire 1)
  tm_run 1 lib timeout 30 sockperf "$mode" --tcp -i "$S" -p $port "$@" >"$D/sockperf-c.log" 2>&1
  c=$?
  bytes=$($payload_cmd "$D/sockperf-c.log")
  SOCKPERF_WIRE=$(($(tm_wire_settled 1) - w0)) SOCKPERF_BYTES=${bytes:-0} SOCKPERF_EXIT=$c
  kill -0 "$spid" 2>/dev/null
  check "$name: the sockperf server is still serving after the client" $?
  stopped "sockperf server" "$spid"
  [[ $c -eq 0 ]] || tail_logs "$D"/sockperf-{s,c}.log
}

# Payloads from sockperf's logs: ping-pong, every message of the run both ways; throughput,
# every message sent.
PP_SIZE=16384 TP_SIZE=16384
pp_payload() {
  sed 's/\x1b\[[0-9;]*m//g' "$1" | awk -v m=$PP_SIZE -F'[=;]' '/\[Total Run\]/ {
    for (i = 1; i < NF; i++) { if ($i ~ /SentMessages$/) s = $(i + 1); if ($i ~ /ReceivedMessages$/) r = $(i + 1) }
    printf "%.0f\n", (s + r) * m }'
}
tp_payload() { awk -v m=$TP_SIZE '/Total of [0-9]+ messages sent/ {printf "%.0f\n", $4 * m}' "$1"; }

case_sockperf_pp() {
  # 16 KiB messages: a bell and an ACK each way per message at most (some 270 bytes on the
  # wire) stay well under 5% of the payload when freeflow carries it.
  sockperf_pair "sockperf ping-pong" pp pp_payload -t 2 -m $PP_SIZE --mps 5000000
  local log=$D/sockperf-c.log lat
  lat=$(awk '/Summary: Latency is/ {print $(NF - 1)}' "$log")
  [[ $SOCKPERF_EXIT -eq 0 ]] && grep -q '# dropped messages = 0; # duplicated messages = 0; # out-of-order messages = 0' "$log" &&
    awk -v l="${lat:-0}" 'BEGIN {exit !(l > 0)}'
  check "sockperf ping-pong ($PP_SIZE B): exit $SOCKPERF_EXIT, latency ${lat:-none} usec, nothing dropped, duplicated or out of order" $?
  carried "sockperf ping-pong" lib lib "$SOCKPERF_WIRE" "$SOCKPERF_BYTES" 5
}

case_sockperf_tp() {
  sockperf_pair "sockperf throughput" tp tp_payload -t 2 -m $TP_SIZE --mps 5000000
  local bw
  bw=$(awk '/Summary: BandWidth is/ {print $5}' "$D/sockperf-c.log")
  [[ $SOCKPERF_EXIT -eq 0 ]] && awk -v b="${bw:-0}" 'BEGIN {exit !(b > 0)}'
  check "sockperf throughput ($TP_SIZE B): exit $SOCKPERF_EXIT, ${bw:-no} MBps" $?
  carried "sockperf throughput" lib lib "$SOCKPERF_WIRE" "$SOCKPERF_BYTES" 5
}

# random_file PATH BYTES: PATH made of BYTES random bytes (AES-CTR under a random key: as
# good as random for a transfer, and fast), its SHA-256 taken on the way into HASH[PATH].
declare -A HASH=()
random_file() {
  mkdir -p "$(dirname "$1")"
  HASH[$1]=$(openssl enc -aes-128-ctr -K "$(openssl rand -hex 16)" -iv "$(openssl rand -hex 16)" \
    -in /dev/zero 2>/dev/null | head -c "$2" | tee "$1" | sha256)
  [[ $(stat -c %s "$1") -eq $2 ]]
}
sha256() { openssl dgst -sha256 -r "$@" | cut -d' ' -f1; }  # of FILE, or stdin; SHA-NI, unlike coreutils'

# records_gone WHAT PID: with the library on one node, once the clients are done and the
# server (the process group PID leads) still runs, the router holds no stream record and
# the server's processes map no stream segment (nginx closes a connection without taking
# it out of its epoll set first: its stream must be given up all the same).
records_gone() {
  [[ $TM_LIB == none || $where != same ]] && return 0
  local n maps=0 p
  n=$(tm_streams_gone 0)
  check "$1 ended, the server still up: the router holds $n stream records (want 0)" $?
  for p in $(pgrep -g "$2"); do
    maps=$((maps + $(grep -c 'memfd:ffrouter-stream (deleted)' "/proc/$p/maps" 2>/dev/null || true)))
  done
  [[ $maps -eq 0 ]]
  check "$1 ended: the server's processes map $maps stream segments (want 0)" $?
}

# nginx_up HOW: nginx in pod 0 serving $BIG/www at http://$S:8080/ (tm_nginx, its folder
# $D/nginx). PID in NGINX_PID.
nginx_up() {
  mkdir -p "$BIG/www"
  tm_nginx 0 "$1" "$D/nginx" "$BIG/www" 8080
  NGINX_PID=$FF_LAST_PID
  wait_listen 0 "$NGINX_PID" 8080 || { check "nginx listens" 1; tail_logs "$D/nginx/error.log"; return 1; }
  preloaded nginx "$NGINX_PID" "$1"
}

# curl_get NAME SERVER_HOW CLIENT_HOW FILE PERCENT: curl in pod 1 downloads FILE of $BIG/www
# into $BIG, checked by size and hash against the original; then `carried`.
curl_get() {
  local name=$1 file=$4 w0 c want got size
  want=${HASH[$BIG/www/$file]}
  w0=$(tm_wire 1)
  tm_run 1 "$3" timeout 120 curl -sS --http1.1 -o "$BIG/got-$file" "http://$S:8080/$file" 2>"$D/curl-$file.err"
  c=$?
  local wire=$(($(tm_wire_settled 1) - w0))
  size=$(stat -c %s "$BIG/got-$file" 2>/dev/null || echo 0)
  got=$(sha256 "$BIG/got-$file" 2>/dev/null)
  rm -f "$BIG/got-$file"
  [[ $c -eq 0 && $got == "$want" && $size -eq $(stat -c %s "$BIG/www/$file") ]]
  check "$name: curl exit $c, $size bytes, SHA-256 ${got:0:16}... (want ${want:0:16}...)" $?
  [[ $c -eq 0 ]] || tail_logs "$D/curl-$file.err" "$D/nginx/error.log"
  carried "$name" "$2" "$3" "$wire" "$size" "$5"
}

# nginx_download NAME SERVER_HOW CLIENT_HOW: a 64 MiB download (the mixed cases).
nginx_download() {
  random_file "$BIG/www/mid.bin" $((64 << 20)) || { check "$1: a 64 MiB file made" 1; return; }
  nginx_up "$2" || return
  curl_get "$1" "$2" "$3" mid.bin 1
  stopped nginx "$NGINX_PID"
}

case_nginx_curl() {
  mkdir -p "$BIG/www"
  random_file "$BIG/www/a.bin" 4096 && random_file "$BIG/www/b.bin" 65536 &&
    random_file "$BIG/www/big.bin" $((1 << 30))
  check "files made (4 KiB, 64 KiB and 1 GiB of random bytes)" $? || return
  nginx_up lib || return
  # HTTP/1.1 keep-alive: two requests on one connection, as curl and nginx both say.
  local c ok=0
  tm_run 1 lib timeout 30 curl -sS -v --http1.1 -o "$BIG/got-a" -o "$BIG/got-b" \
    "http://$S:8080/a.bin" "http://$S:8080/b.bin" 2>"$D/curl-v.err"
  c=$?
  [[ $c -eq 0 && $(sha256 "$BIG/got-a") == "${HASH[$BIG/www/a.bin]}" &&
    $(sha256 "$BIG/got-b") == "${HASH[$BIG/www/b.bin]}" ]] || ok=1
  check "curl url1 url2: both files intact (exit $c)" $ok
  grep -q 'Re-using existing connection' "$D/curl-v.err"
  check "curl re-used its connection for the second request" $?
  # nginx writes its access log line when a request ends: wait for both (bounded).
  wait_line "$D/nginx/access.log" ' /b\.bin 200 ' 5 >/dev/null
  awk '$3 == "/a.bin" {a = $1; an = $2} $3 == "/b.bin" {b = $1; bn = $2}
    END {exit !(a != "" && a == b && an == 1 && bn == 2)}' "$D/nginx/access.log"
  check "nginx served both on one connection, as its requests 1 and 2" $?
  [[ $ok -eq 0 ]] || tail_logs "$D/curl-v.err" "$D/nginx/access.log" "$D/nginx/error.log"
  curl_get "curl of 1 GiB from nginx" lib lib big.bin 1
  records_gone "nginx's connections" "$NGINX_PID"
  stopped nginx "$NGINX_PID"
}

# nginx_proxy: nginx in pod 1 as a reverse proxy (HTTP/1.1, kept-alive upstream connections)
# to nginx in pod 0, curl in pod 1 through it on loopback. nginx puts an upstream socket in
# its epoll set before it connects (ngx_event_connect_peer): the set must follow that socket
# until connect() makes it a stream, which takes the registration over (docs/tcp-mode.md,
# "Which registrations a set follows"), or the proxy never hears of the upstream's bytes.
case_nginx_proxy() {
  random_file "$BIG/www/mid.bin" $((64 << 20)) || { check "a 64 MiB file made" 1; return; }
  nginx_up lib || return
  local c=$D/proxy w0 wire i ok=0
  tm_nginx_with 1 lib "$c" "  access_log off;
  upstream pod0 { server $S:8080; keepalive 4; }
  server {
    listen 127.0.0.1:8081;
    location / {
      proxy_pass http://pod0;
      proxy_http_version 1.1;
      proxy_set_header Connection \"\";
      proxy_buffering off;
    }
  }"
  local ppid=$FF_LAST_PID
  wait_listen 1 "$ppid" 8081 || { check "the proxy listens" 1; tail_logs "$c/error.log"; return; }
  preloaded "the proxy" "$ppid" lib
  w0=$(tm_wire 1)
  for i in 1 2; do
    tm_run 1 lib timeout 60 curl -sS -o "$BIG/got-proxy" "http://127.0.0.1:8081/mid.bin" \
      2>"$D/curl-proxy.err" || ok=1
    [[ $(sha256 "$BIG/got-proxy" 2>/dev/null) == "${HASH[$BIG/www/mid.bin]}" ]] || ok=1
    rm -f "$BIG/got-proxy"
  done
  wire=$(($(tm_wire_settled 1) - w0))
  check "two 64 MiB downloads through the proxy, both intact by SHA-256" $ok ||
    tail_logs "$D/curl-proxy.err" "$c/error.log" "$D/nginx/error.log"
  carried "nginx proxying to nginx" lib lib "$wire" $((2 * (64 << 20))) 1
  stopped "the proxy" "$ppid"
  records_gone "the proxy's upstream connections" "$NGINX_PID"
  stopped nginx "$NGINX_PID"
}

case_redis() {
  local port=6390 c=$D/redis
  tm_redis 0 lib "$c" $port
  local spid=$FF_LAST_PID
  wait_listen 0 "$spid" $port || { check "redis-server listens" 1; tail_logs "$c/redis.log"; return; }
  preloaded redis-server "$spid" lib
  local value="freeflow-$RANDOM$RANDOM" got
  got=$(tm_run 1 lib timeout 10 redis-cli -h "$S" -p $port SET tm:key "$value" 2>&1)$(
    tm_run 1 lib timeout 10 redis-cli -h "$S" -p $port GET tm:key 2>&1)
  [[ $got == "OK$value" ]]
  check "redis-cli SET then GET gives the value back ($got)" $?
  # 16 KiB values, each request answered before the next on its connection: a bell and an
  # ACK each way per request at most stay well under 5% of the payload under freeflow.
  local n=5000 d=16384 w0 st
  w0=$(tm_wire 1)
  tm_run 1 lib timeout 120 redis-benchmark -h "$S" -p $port -n $n -d $d -t set,get,lpush,lpop -q \
    >"$c/bench.log" 2>&1
  st=$?
  local wire=$(($(tm_wire_settled 1) - w0))
  tr '\r' '\n' <"$c/bench.log" | grep -E '^[A-Z]+: .*requests per second' | tail -n 4
  [[ $st -eq 0 ]] && ! grep -qiE 'error|could not' "$c/bench.log" &&
    [[ $(tr '\r' '\n' <"$c/bench.log" | grep -cE '^(SET|GET|LPUSH|LPOP): [0-9.]*[1-9][0-9.]* requests per second') -eq 4 ]]
  check "redis-benchmark -t set,get,lpush,lpop -n $n -d $d: 4 rates, no error (exit $st)" $?
  [[ $st -eq 0 ]] || tail_logs "$c/bench.log" "$c/redis.log"
  carried "redis-benchmark" lib lib "$wire" $((4 * n * d)) 5
  stopped redis-server "$spid"
}

case_scp() {
  local port=2222 c=$D/ssh made_run=0
  mkdir -p "$c"
  { ssh-keygen -q -t ed25519 -N '' -f "$c/host_key" && ssh-keygen -q -t ed25519 -N '' -f "$c/id" &&
    cp "$c/id.pub" "$c/authorized_keys"; } || { check "keys made" 1; return; }
  printf '%s\n' "Port $port" "ListenAddress $S" "HostKey $c/host_key" "PidFile $c/sshd.pid" \
    "AuthorizedKeysFile $c/authorized_keys" "PermitRootLogin prohibit-password" "PasswordAuthentication no" \
    "KbdInteractiveAuthentication no" "UsePAM no" "StrictModes no" "LogLevel VERBOSE" \
    "Subsystem sftp /usr/lib/openssh/sftp-server" >"$c/sshd_config"
  # sshd's privilege-separation folder (Debian's init script makes it); removed if made here.
  [[ -d /run/sshd ]] || { mkdir -m 0755 /run/sshd && made_run=1; }
  random_file "$BIG/src.bin" $((1 << 30))
  check "a 1 GiB file of random bytes made" $? || return
  # In the foreground (-D), re-executing itself for each connection (the default): the
  # connection's socket goes through fork and exec into the new sshd.
  tm_bg 0 lib /usr/sbin/sshd -D -e -f "$c/sshd_config" 2>"$c/sshd.log"
  local spid=$FF_LAST_PID w0 st
  if wait_listen 0 "$spid" $port; then
    preloaded sshd "$spid" lib
    w0=$(tm_wire 1)
    # AES-GCM (AES-NI) rather than the default ChaCha20: the cipher is not under test, the
    # suite's time is.
    tm_run 1 lib timeout 120 scp -q -F /dev/null -i "$c/id" -P $port -o BatchMode=yes -o IdentitiesOnly=yes \
      -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o GlobalKnownHostsFile=/dev/null \
      -o LogLevel=ERROR -c aes128-gcm@openssh.com "root@$S:$BIG/src.bin" "$BIG/dst.bin" 2>"$c/scp.err"
    st=$?
    local wire=$(($(tm_wire_settled 1) - w0)) size want got
    size=$(stat -c %s "$BIG/dst.bin" 2>/dev/null || echo 0)
    want=${HASH[$BIG/src.bin]} got=$(sha256 "$BIG/dst.bin" 2>/dev/null)
    rm -f "$BIG/src.bin" "$BIG/dst.bin"
    [[ $st -eq 0 && $size -eq $((1 << 30)) && $got == "$want" ]]
    check "scp of 1 GiB from the server pod: exit $st, $size bytes, SHA-256 ${got:0:16}... (want ${want:0:16}...)" $?
    grep -q "Accepted publickey for root from $(ff_pod_ip 1)" "$c/sshd.log"
    check "sshd accepted the client's key" $?
    [[ $st -eq 0 ]] || tail_logs "$c/scp.err" "$c/sshd.log"
    carried "scp" lib lib "$wire" "$size" 5
  else
    check "sshd listens" 1
    tail_logs "$c/sshd.log"
  fi
  stopped sshd "$spid"
  ((made_run)) && rmdir /run/sshd 2>/dev/null
}

# The router restarts in the middle of a transfer (one node): the connection goes on through
# freeflow (the router is not on its data path), and connections made after the restart are
# accelerated again (iperf3's control connection makes the server's library register its
# listener with the new router; its data connection is then a stream).
case_router_restart() {
  local port=5201 w0 cpid st bytes
  tm_bg 0 lib iperf3 -s -B "$S" -p $port >"$D/iperf-s.log" 2>&1  # serves both runs
  local spid=$FF_LAST_PID
  wait_listen 0 "$spid" $port || { check "the iperf3 server listens" 1; return; }
  w0=$(tm_wire 1)
  tm_run 1 lib timeout 30 iperf3 -c "$S" -p $port -J -t 4 >"$D/iperf-c.json" 2>"$D/iperf-c.err" &
  cpid=$!
  sleep 1.5
  pod_router_kill 0 TERM
  # shellcheck disable=SC2119  # no extra flags
  router_up_known_pods
  check "the router started again during the transfer" $?
  wait "$cpid"
  st=$?
  bytes=$(tm_json "$D/iperf-c.json" 'j["end"]["sum_received"]["bytes"]')
  [[ $st -eq 0 && ${bytes:-0} -gt 0 ]]
  check "iperf3 -t 4 across the restart: exit $st, ${bytes:-no} bytes" $?
  [[ $st -eq 0 ]] || tail_logs "$D/iperf-c.err" "$D/iperf-c.json" "$FF_DIR/router.log"
  carried "the connection across the restart" lib lib $(($(tm_wire_settled 1) - w0)) "${bytes:-0}" 1
  w0=$(tm_wire 1)
  tm_run 1 lib timeout 30 iperf3 -c "$S" -p $port -J -t 1 >"$D/iperf-c2.json" 2>"$D/iperf-c2.err"
  st=$?
  bytes=$(tm_json "$D/iperf-c2.json" 'j["end"]["sum_received"]["bytes"]')
  [[ $st -eq 0 && ${bytes:-0} -gt 0 ]]
  check "a new iperf3 after the restart: exit $st, ${bytes:-no} bytes" $?
  carried "the connection made after the restart" lib lib $(($(tm_wire_settled 1) - w0)) "${bytes:-0}" 1
  stopped "iperf3 server" "$spid"
}

# case_short: 2000 short connections one after another (bench/cm_rate.cc's TCP client and
# server: connect, accept, close on both sides), then an iperf3 that must still be carried as
# the case says: a pod's closed connections must not hold its quotas and turn its next ones
# into kernel TCP. On one node the router must hold no record soon after, and the client must
# have given most of them to the kernel without asking (dial_policy.h: three short ones, then
# 64 and more without a round trip).
case_short() {
  local port=7300 c s line asks0
  asks0=$(tm_sock_asks 0)
  tm_bg 0 lib "$FF_BUILD/bench/cm_rate" tcp-server $port 2000 >"$D/short-s.log" 2>&1
  local spid=$FF_LAST_PID
  tm_run 1 lib timeout 60 "$FF_BUILD/bench/cm_rate" tcp-client "$S" $port 2000 >"$D/short-c.log" 2>&1
  c=$?
  wait_pid "$spid" 10
  s=$?
  line=$(grep ' connections: ' "$D/short-c.log")
  [[ $c -eq 0 && $s -eq 0 && -n $line ]]
  check "2000 short connections (client exit $c, server exit $s): ${line:-none}" $? ||
    tail_logs "$D"/short-{s,c}.log
  if [[ $where == same ]]; then
    local i streams=""
    for ((i = 0; i < 30; i++)); do
      streams=$(router_stats_line | sed -n 's/.* streams=\([0-9]*\).*/\1/p')
      [[ $streams == 0 ]] && break
      sleep 0.1
    done
    [[ $streams == 0 ]]
    check "the router holds no record of the closed connections (streams=$streams)" $?
    local asks=$(($(tm_sock_asks 0) - asks0))
    ((asks < 200))
    check "2000 short connections cost $asks round trips to the router (fewer than 200)" $?
  fi
  iperf "iperf3 after the short connections" lib lib -t 1
}

# A process-per-connection server (issue 39): socat forks a process for each connection and
# echoes (PIPE); bench/rr_load drives 4 connections of small requests, a thread each, and
# checks every byte that comes back and a clean close (the server's end of file after ours).
case_socat_fork() {
  local port=7400 c w0 wire n line
  tm_bg 0 lib socat "TCP-LISTEN:$port,fork,reuseaddr" PIPE >"$D/socat.log" 2>&1
  local spid=$FF_LAST_PID
  wait_listen 0 "$spid" $port || true
  preloaded "socat" "$spid" lib
  w0=$(tm_wire 1)
  tm_run 1 lib timeout 60 "$FF_BUILD/bench/rr_load" "$S" $port 4 512 2 >"$D/rr.log" 2>&1
  c=$?
  wire=$(($(tm_wire_settled 1) - w0))
  line=$(grep '^rr_load:' "$D/rr.log")
  [[ $c -eq 0 && -n $line ]]
  check "4 clients of socat's forked echo, every byte checked (exit $c): ${line:-none}" $? ||
    tail_logs "$D"/{socat,rr}.log
  n=$(sed -n 's/.* \([0-9]*\) requests, .*/\1/p' <<<"$line")
  carried "socat echo" lib lib "$wire" "$((2 * 512 * ${n:-0}))" 5
  records_gone "socat's connections" "$spid"
  stopped "socat" "$spid"
}

# A burst of connects to a server whose accept queue is full (late_accept.py: a backlog of
# 1, nothing accepted for 1.5 s): the kernel drops the last ACK of most handshakes, and the
# clients believe themselves connected. Kernel TCP completes them with the clients' first
# data, retransmitted until the server has room; an accelerated connection's data goes
# through its segment, so its kernel connection must carry something too (stream.cc,
# StreamOpened), or the server never accepts it and the client waits for ever. Every
# connection must get its echoes once the server accepts.
case_backlog() {
  local port=7410 c line n=8
  tm_bg 0 lib python3 "$FF_SRC/tests/integration/tcp_mode/late_accept.py" "$S" $port $n 1.5 \
    >"$D/late.log" 2>&1
  local spid=$FF_LAST_PID
  wait_line "$D/late.log" listening 10 || true
  preloaded "the late-accepting server" "$spid" lib
  tm_run 1 lib timeout 60 "$FF_BUILD/bench/rr_load" "$S" $port $n 64 5 >"$D/rr.log" 2>&1
  c=$?
  line=$(grep '^rr_load:' "$D/rr.log")
  [[ $c -eq 0 && -n $line ]]
  check "$n clients of a server whose accept queue overflowed, every byte checked (exit $c): ${line:-none}" $? ||
    tail_logs "$D"/{late,rr}.log
  wait_pid "$spid" 10 >/dev/null
  c=$?
  grep -q "^echoed $n connections" "$D/late.log"
  check "the server accepted and echoed all $n connections (exit $c): $(tail -n 1 "$D/late.log")" $?
  records_gone "the late server's connections" "$spid"
}

# ab_run NAME N ARGS...: ab in pod 1 makes N requests for ab.bin (1 KiB) with 4 clients and
# ARGS: every request complete, none failed (ab compares each response's length with the
# first's) or other than 2xx; with -k each on a kept-alive connection. nginx then logged N
# more requests for it, each with the whole file; on as many connections as requests
# without -k, on a few with it. The ab log stays in $D/ab.log.
ab_run() {
  local name=$1 n=$2 c got failed other ka logged conns want i w0 wire
  shift 2
  local before
  before=$(grep -c ' /ab\.bin 200 1024$' "$D/nginx/access.log" 2>/dev/null)
  w0=$(tm_wire 1)
  tm_run 1 lib timeout 60 ab -q -n "$n" -c 4 "$@" "http://$S:8080/ab.bin" >"$D/ab.log" 2>&1
  c=$?
  wire=$(($(tm_wire_settled 1) - w0))
  got=$(sed -n 's/^Complete requests: *\([0-9]*\).*/\1/p' "$D/ab.log")
  failed=$(sed -n 's/^Failed requests: *\([0-9]*\).*/\1/p' "$D/ab.log")
  other=$(sed -n 's/^Non-2xx responses: *\([0-9]*\).*/\1/p' "$D/ab.log")
  ka=$(sed -n 's/^Keep-Alive requests: *\([0-9]*\).*/\1/p' "$D/ab.log")
  [[ $c -eq 0 && $got == "$n" && $failed == 0 && -z $other ]] &&
    { [[ " $* " != *" -k "* ]] || [[ $ka == "$n" ]]; }
  check "$name: $n requests by 4 clients (exit $c): ${got:-?} complete, ${failed:-?} failed, ${other:-0} not 2xx, ${ka:-0} kept alive" $? ||
    tail_logs "$D/ab.log" "$D/nginx/error.log"
  # nginx writes a request's line when it ends: wait for them all (bounded).
  want=$((before + n))
  for ((i = 0; i < 50; i++)); do
    logged=$(grep -c ' /ab\.bin 200 1024$' "$D/nginx/access.log")
    [[ $logged -ge $want ]] && break
    sleep 0.1
  done
  conns=$(grep ' /ab\.bin 200 1024$' "$D/nginx/access.log" | tail -n "$n" | cut -d' ' -f1 | sort -u | wc -l)
  if [[ " $* " == *" -k "* ]]; then
    [[ $logged -eq $want && $conns -le 8 ]]
  else
    [[ $logged -eq $want && $conns -eq $n ]]
  fi
  check "$name: nginx logged $((logged - before)) whole responses on $conns connections" $?
  [[ " $* " == *" -k "* ]] && carried "$name" lib lib "$wire" $((n * 1024)) 5
  return 0
}

# grpc_calls CLIENTS SIZE SECONDS: bench/grpc/grpc_rr's clients in pod 1 call the server at
# $S:$GRPC_PORT, every answer checked against what was sent; then `carried`.
grpc_calls() {
  local c w0 wire line n
  w0=$(tm_wire 1)
  tm_run 1 lib timeout 60 "$FF_BUILD/bench/grpc/grpc_rr" client "$S:$GRPC_PORT" "$1" "$2" "$3" \
    >"$D/grpc-c.log" 2>&1
  c=$?
  wire=$(($(tm_wire_settled 1) - w0))
  line=$(grep '^grpc_rr:' "$D/grpc-c.log")
  [[ $c -eq 0 && -n $line ]]
  check "$1 gRPC clients of $2 B unary calls, every answer checked (exit $c): ${line:-none}" $? ||
    tail_logs "$D"/grpc-{s,c}.log
  n=$(sed -n 's/.* \([0-9]*\) requests$/\1/p' <<<"$line")
  carried "gRPC, $1 clients of $2 B" lib lib "$wire" "$((2 * $2 * ${n:-0}))" 5
}

# grpc: gRPC unary calls (the C++ gRPC the device plugin uses, HTTP/2 over threads that
# sleep in epoll) to a server in pod 0, both with the library.
case_grpc() {
  GRPC_PORT=7500
  tm_bg 0 lib "$FF_BUILD/bench/grpc/grpc_rr" server "$S:$GRPC_PORT" >"$D/grpc-s.log" 2>&1
  local spid=$FF_LAST_PID
  wait_listen 0 "$spid" $GRPC_PORT || true
  preloaded "the gRPC server" "$spid" lib
  grpc_calls 8 16384 2
  grpc_calls 1 64 1
  records_gone "the gRPC clients' connections" "$spid"
  stopped "the gRPC server" "$spid"
}

# ab: ApacheBench against nginx, both with the library, with keep-alive and without.
case_ab() {
  mkdir -p "$BIG/www"
  random_file "$BIG/www/ab.bin" 1024
  check "file made (1 KiB of random bytes)" $? || return
  nginx_up lib || return
  ab_run "ab -k" 2000 -k
  ab_run "ab without keep-alive" 400
  records_gone "ab's connections" "$NGINX_PID"
  stopped nginx "$NGINX_PID"
}

case $case in
  socat_fork) case_socat_fork ;;
  backlog) case_backlog ;;
  ab) case_ab ;;
  grpc) case_grpc ;;
  iperf3) iperf "iperf3, 1 stream" lib lib -t 2 ;;
  iperf3_p4) iperf "iperf3, 4 streams" lib lib -t 2 -P 4 ;;
  iperf3_R) iperf "iperf3 -R (the server sends)" lib lib -t 2 -R ;;
  sockperf_pp) case_sockperf_pp ;;
  sockperf_tp) case_sockperf_tp ;;
  nginx_curl) case_nginx_curl ;;
  nginx_proxy) case_nginx_proxy ;;
  redis) case_redis ;;
  scp) case_scp ;;
  short) case_short ;;
  router_restart)
    [[ $where == same ]] || { echo "router_restart runs on one node"; exit 2; }
    case_router_restart
    ;;
  mixed_client)
    iperf "iperf3, the client alone with the library" plain lib -t 2
    nginx_download "curl with the library from nginx without it" plain lib
    ;;
  mixed_server)
    iperf "iperf3, the server alone with the library" lib plain -t 2
    nginx_download "curl without the library from nginx with it" lib plain
    ;;
  *)
    echo "unknown case $case"
    exit 2
    ;;
esac
# Connections that cannot be accelerated (another node, a peer without the library) cost
# nothing: the router's pod list tells the library so, without a round trip.
if [[ $TM_LIB != none && ($where == cross || $case == mixed_*) ]]; then
  asks="$(tm_sock_asks 0) $(tm_sock_asks 1)"
  [[ $asks == "0 0" ]]
  check "no connection asked the router (SockConnect/SockClaim answered by pod 0's and pod 1's routers: $asks)" $?
fi
[[ $failures -eq 0 ]]
