# shellcheck shell=bash
# Helpers of TCP mode (docs/tcp-mode.md) for tests/integration/tcp_mode/tcp_mode.sh and
# bench/tcp_mode.sh: unmodified socket programs in pods 0 and 1 of two_pods_up (one node or
# two), each with libfsocket.so preloaded ("lib") or without it ("plain").
# Requires scripts/lib/cluster.sh to be sourced. TM_LIB is the library's path, or "none" to
# run every program plain (what the harness itself is checked with before the library exists).
# Safe under set -e (the benchmark's).

TM_LIB=${TM_LIB:-none}
TM_VNET=10.244.0.0/16  # the routers' --vnet-prefix (cluster.sh)
TM_GROUPS=()           # servers started with tm_bg: each leads its own process group

# tm_dir I: the folder of the router serving pod I (FREEFLOW_DIR).
tm_dir() { if [[ $FF_PLACEMENT == cross ]]; then mn_dir "$1"; else echo "$FF_DIR"; fi; }

# tm_env I lib|plain: sets TM_ENV to the environment a program of pod I starts with: TCP
# mode's (the library, its router and the virtual network) for "lib" when there is a
# library, nothing else.
tm_env() {
  TM_ENV=()
  [[ $2 == lib && $TM_LIB != none ]] &&
    TM_ENV=("LD_PRELOAD=$TM_LIB" FFR_NAME=ffrouter "FREEFLOW_DIR=$(tm_dir "$1")" "VNET_PREFIX=$TM_VNET")
  return 0
}

# tm_run I lib|plain CMD...: runs CMD in pod I (the caller bounds it, e.g. with timeout).
tm_run() {
  local i=$1
  tm_env "$1" "$2"
  shift 2
  ip netns exec "$(ff_pod_ns "$i")" env "${TM_ENV[@]}" "$@"
}

# tm_bg I lib|plain CMD...: CMD in the background in pod I, in a process group of its own
# (setsid: the script's children are no group leaders, so it does not fork), so that tm_stop
# also reaches what it forks (nginx's workers). Its PID is FF_LAST_PID, also kept in
# FF_PIDS and TM_GROUPS.
tm_bg() {
  local i=$1
  tm_env "$1" "$2"
  shift 2
  ip netns exec "$(ff_pod_ns "$i")" setsid env "${TM_ENV[@]}" "$@" &
  FF_LAST_PID=$!
  FF_PIDS+=("$FF_LAST_PID")
  TM_GROUPS+=("$FF_LAST_PID")
}

# tm_stop PID [SECONDS]: SIGTERM to the process group PID leads (a server of tm_bg), then
# waits at most SECONDS (5) for PID to exit; SIGKILL to the group after that. False when it
# had to be killed: a server that does not end on SIGTERM.
tm_stop() {
  local pid=$1 limit=${2:-5} i
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < limit * 20; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  if kill -0 "$pid" 2>/dev/null; then
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    return 1
  fi
  wait "$pid" 2>/dev/null || true
  return 0
}

# tm_nginx_with I HOW DIR HTTP: nginx in pod I, HOW (tm_bg: its PID in FF_LAST_PID), a master
# and 2 workers with their configuration, logs and temporary folders in DIR, and HTTP (lines
# of nginx configuration: servers, upstreams, logs) in its http block.
tm_nginx_with() {
  local c=$3
  mkdir -p "$c"
  cat >"$c/nginx.conf" <<EOF
daemon off;
master_process on;
worker_processes 2;
user root;
pid $c/nginx.pid;
error_log $c/error.log;
events { worker_connections 64; }
http {
  client_body_temp_path $c/body;
  proxy_temp_path $c/proxy;
  fastcgi_temp_path $c/fastcgi;
  uwsgi_temp_path $c/uwsgi;
  scgi_temp_path $c/scgi;
$4
}
EOF
  tm_bg "$1" "$2" nginx -p "$c" -c "$c/nginx.conf" -e "$c/error.log"
}

# tm_nginx I HOW DIR ROOT PORT: tm_nginx_with serving ROOT at http://<pod I>:PORT/ with
# sendfile and keep-alive; the access log (DIR/access.log) names each request's connection
# and its number on it.
tm_nginx() {
  tm_nginx_with "$1" "$2" "$3" "  log_format conn '\$connection \$connection_requests \$request_uri \$status \$body_bytes_sent';
  access_log $3/access.log conn;
  default_type application/octet-stream;
  sendfile on;
  keepalive_timeout 30s;
  server {
    listen $(ff_pod_ip "$1"):$5;
    root $4;
  }"
}

# tm_redis I HOW DIR PORT: redis-server in pod I, HOW (tm_bg: its PID in FF_LAST_PID), on
# <pod I>:PORT without persistence, its configuration and log (DIR/redis.log) in DIR.
tm_redis() {
  mkdir -p "$3"
  printf '%s\n' "bind $(ff_pod_ip "$1")" "port $4" "protected-mode no" 'save ""' "appendonly no" \
    "dir $3" "daemonize no" "logfile $3/redis.log" >"$3/redis.conf"
  tm_bg "$1" "$2" redis-server "$3/redis.conf"
}

# tm_sweep: ends every process still in the two pods (all of them started here, directly or
# by a server: sshd's per-connection processes make sessions of their own), SIGTERM then
# SIGKILL after 2 s; prints what it found.
tm_sweep() {
  local i pids=() left
  for i in 0 1; do
    [[ -e /run/netns/$(ff_pod_ns "$i") ]] || continue
    mapfile -t -O "${#pids[@]}" pids < <(ip netns pids "$(ff_pod_ns "$i")" 2>/dev/null)
  done
  ((${#pids[@]} == 0)) && return 0
  echo "still running in the pods: $(ps -o pid=,args= -p "$(IFS=,; echo "${pids[*]}")" 2>/dev/null | tr '\n' ';')"
  kill -TERM "${pids[@]}" 2>/dev/null || true
  for ((i = 0; i < 40; i++)); do
    left=$(ps -o pid= -p "$(IFS=,; echo "${pids[*]}")" 2>/dev/null)
    [[ -z $left ]] && return 0
    sleep 0.05
  done
  # shellcheck disable=SC2086  # one PID a word
  kill -KILL $left 2>/dev/null || true
  return 0
}

# tm_down: tm_stop for every server still running, tm_sweep, two_pods_down.
tm_down() {
  local p
  for p in "${TM_GROUPS[@]}"; do
    if kill -0 "$p" 2>/dev/null; then tm_stop "$p" 2 || true; fi
  done
  TM_GROUPS=()
  tm_sweep
  two_pods_down
}

# tm_stat I KEY: the figure KEY of the stats line of the router serving pod I, now.
tm_stat() {
  local line
  if [[ $FF_PLACEMENT == cross ]]; then
    line=$(router_stats_line "${FF_NODE_ROUTER[$1]}" "$(pod_router_log "$1")")
  else
    line=$(router_stats_line)
  fi
  sed -n "s/.* $2=\([0-9]*\).*/\1/p" <<<"$line"
}

# tm_sock_asks I: the SockConnect and SockClaim requests the router of pod I has answered:
# the round trips a connection made to find out whether it can be accelerated.
tm_sock_asks() { tm_stat "$1" sock_asks; }

# tm_streams I: the stream records the router of pod I holds now.
tm_streams() { tm_stat "$1" streams; }

# tm_streams_gone I: prints how many stream records the router of pod I holds once it holds
# none (2 s at most), or after that; true when none.
tm_streams_gone() {
  local i n
  for ((i = 0; i < 20; i++)); do
    n=$(tm_streams "$1")
    [[ $n == 0 ]] && break
    sleep 0.1
  done
  echo "${n:-unknown}"
  [[ $n == 0 ]]
}

# tm_wire I: bytes that crossed pod I's eth0 so far, both directions (its veth's counters,
# read inside the pod's namespace, where /sys is the namespace's).
tm_wire() {
  ip netns exec "$(ff_pod_ns "$1")" cat /sys/class/net/eth0/statistics/tx_bytes \
    /sys/class/net/eth0/statistics/rx_bytes 2>/dev/null | awk '{s += $1} END {printf "%.0f\n", s}'
}

# tm_wire_settled I: tm_wire once it has stopped moving (two reads 0.1 s apart agree; 3 s at
# the most), so that what a client that has just exited left in its send buffer is counted.
tm_wire_settled() {
  local a b i
  b=$(tm_wire "$1")
  for ((i = 0; i < 30; i++)); do
    sleep 0.1
    a=$b
    b=$(tm_wire "$1")
    [[ $a == "$b" ]] && break
  done
  echo "$b"
}

# tm_json FILE EXPR: EXPR (Python, over the object j) of the JSON in FILE; nothing when FILE
# is not JSON or EXPR fails (iperf3 -J's output).
tm_json() {
  python3 -c 'import json, sys
try:
    j = json.load(open(sys.argv[1]))
    print(eval(sys.argv[2]))
except Exception:
    pass' "$1" "$2"
}
