# shellcheck shell=bash
# Shared helpers for integration tests, the demo and the benchmarks: a one-node
# "cluster" made of network namespaces on this machine.
#
#   node namespace  ff<tag>n : bridge ffbr (10.244.<net>.1/24), runs ffrouter
#   pod namespaces  ff<tag>p<i> : eth0 (10.244.<net>.<10+i>/24), veth to the bridge
#
# Everything created is recorded and removed by cluster_down (also on EXIT when the
# caller traps it). Processes are only ever stopped by the PID this file started.

FF_SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
FF_BUILD=${FF_BUILD:-$FF_SRC/build}
FF_TAG=${FF_TAG:-$$}
# Pod subnets stay below 10.244.192.0 so that every pod has a valid LID (low 16 bits).
FF_NET=${FF_NET:-$(( (FF_TAG % 160) + 20 ))}
FF_NODE=ff${FF_TAG}n
FF_DIR=""
FF_ROUTER_PID=""
FF_PODS=()
FF_PIDS=()

# The per-pod descriptor quota test routers run with: a real node's, whose usual 1 Mi
# RLIMIT_NOFILE holds 256 pods at the default 1024. Under this machine's 20 000 the router
# would fit its default to 77 a pod (docs/security.md), too few for the TCP-mode suites'
# many connections in one pod. Empty: the router's own fitted default (bench/scale.sh).
FF_POD_FDS=${FF_POD_FDS-1024}
ff_quota_args() { [[ -z $FF_POD_FDS ]] || echo "--max-fds-per-pod=$FF_POD_FDS"; }

ff_pod_ns() { echo "ff${FF_TAG}p$1"; }
ff_pod_ip() { echo "10.244.${FF_NET}.$((10 + $1))"; }

cluster_up() {
  local npods=${1:-2}
  FF_DIR=$(mktemp -d /tmp/freeflow-test.XXXXXX)
  ip netns add "$FF_NODE"
  ip -n "$FF_NODE" link set lo up
  ip -n "$FF_NODE" link add ffbr type bridge
  ip -n "$FF_NODE" addr add "10.244.${FF_NET}.1/24" dev ffbr
  ip -n "$FF_NODE" link set ffbr up
  local i ns
  for ((i = 0; i < npods; i++)); do
    ns=$(ff_pod_ns "$i")
    ip netns add "$ns"
    FF_PODS+=("$ns")
    ip -n "$ns" link set lo up
    ip link add "ffv${FF_TAG}x$i" type veth peer name eth0 netns "$ns"
    ip link set "ffv${FF_TAG}x$i" netns "$FF_NODE"
    ip -n "$FF_NODE" link set "ffv${FF_TAG}x$i" master ffbr up
    ip -n "$ns" addr add "$(ff_pod_ip "$i")/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" route add default via "10.244.${FF_NET}.1"
  done
}

# Starts the router in the node namespace; extra arguments go to ffrouter.
router_up() {
  rm -f "$FF_DIR/ffrouter.sock"
  # shellcheck disable=SC2046  # ff_quota_args: no flag, or one without spaces
  ip netns exec "$FF_NODE" "$FF_BUILD/router/ffrouter" --dir "$FF_DIR" --name ffrouter \
    --vnet-prefix 10.244.0.0/16 --log-level "${FF_ROUTER_LOG:-warn}" $(ff_quota_args) "$@" \
    >>"$FF_DIR/router.log" 2>&1 &
  FF_ROUTER_PID=$!
  wait_router "$FF_ROUTER_PID" "$FF_DIR"
}

# wait_router PID DIR: waits (bounded) until the router started as PID serves DIR.
wait_router() {
  local pid=$1 dir=$2 i
  for ((i = 0; i < 200; i++)); do
    [[ -S "$dir/ffrouter.sock" && -f "$dir/libffverbs.so" ]] && return 0
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.02
  done
  echo "router did not start:" >&2
  cat "$dir/router.log" >&2
  return 1
}

# router_up_known_pods [ffrouter args...]: router_up with a static control plane that names
# this node and its pod subnet, as every deployment's control plane does: an address of the
# subnet where no program runs yet is then a pod of this node, not an unknown address
# (rdma_cm rejects a connect to it, as a host without a listener does).
router_up_known_pods() {
  printf '{"nodes": [{"name": "node0", "address": "10.244.%d.1", "port": 7471, "podCIDRs": ["10.244.%d.0/24"]}]}\n' \
    "$FF_NET" "$FF_NET" >"$FF_DIR/cluster.json"
  # One node: no peer ever dials its node port, so no certificates.
  router_up --control-plane "static:$FF_DIR/cluster.json" --node-name node0 \
    --host-ip "10.244.${FF_NET}.1" --port 7471 --insecure-node-links "$@"
}

# router_down [SIGNAL]: stops the router (TERM by default) and forgets its PID.
router_down() {
  if [[ -n "$FF_ROUTER_PID" ]]; then
    kill "-${1:-TERM}" "$FF_ROUTER_PID" 2>/dev/null || true
    wait "$FF_ROUTER_PID" 2>/dev/null || true
    FF_ROUTER_PID=""
  fi
}

# router_stats_line [PID LOG]: the stats line of the router PID (default: this node's) that
# logs to LOG (it logs one on SIGUSR1), waited for (bounded).
router_stats_line() {
  local pid=${1:-$FF_ROUTER_PID} log=${2:-$FF_DIR/router.log} before i
  before=$(grep -c ' stats: ' "$log")
  kill -USR1 "$pid"
  for ((i = 0; i < 200; i++)); do
    [[ $(grep -c ' stats: ' "$log") -gt $before ]] && break
    sleep 0.02
  done
  grep ' stats: ' "$log" | tail -n 1 | sed 's/.* stats: //'
}

# pod_run I CMD...: runs CMD inside pod I with the freeflow library preloaded.
pod_run() {
  local i=$1
  shift
  ip netns exec "$(ff_pod_ns "$i")" env FREEFLOW_DIR="$FF_DIR" FFR_NAME=ffrouter \
    LD_PRELOAD="$FF_DIR/libffverbs.so" "$@"
}

# pod_bg I CMD...: like pod_run in the background; the PID is appended to FF_PIDS and
# stored in FF_LAST_PID.
pod_bg() {
  local i=$1
  shift
  # ip netns exec and env both exec: $! is the PID of the program itself.
  ip netns exec "$(ff_pod_ns "$i")" env FREEFLOW_DIR="$FF_DIR" FFR_NAME=ffrouter \
    LD_PRELOAD="$FF_DIR/libffverbs.so" "$@" &
  FF_LAST_PID=$!
  FF_PIDS+=("$FF_LAST_PID")
}

cluster_down() {
  local p
  for p in "${FF_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${FF_PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  FF_PIDS=()
  router_down
  for p in "${FF_PODS[@]}"; do ip netns del "$p" 2>/dev/null || true; done
  FF_PODS=()
  ip netns del "$FF_NODE" 2>/dev/null || true
  [[ -n "$FF_DIR" ]] && rm -rf "$FF_DIR"
  FF_DIR=""
}

# wait_pid PID SECONDS: waits for a background process, killing it after SECONDS.
# Returns its exit status, or 124 on timeout.
wait_pid() {
  local pid=$1 limit=$2 i
  for ((i = 0; i < limit * 20; i++)); do
    if ! kill -0 "$pid" 2>/dev/null; then
      wait "$pid"
      return $?
    fi
    sleep 0.05
  done
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  return 124
}

# wait_line FILE REGEX SECONDS [PID]: waits (bounded) until a line of FILE matches REGEX;
# false at once when the process PID that writes FILE has exited without writing it.
wait_line() {
  local i
  for ((i = 0; i < $3 * 20; i++)); do
    grep -qE "$2" "$1" 2>/dev/null && return 0
    if [[ -n ${4:-} ]] && ! kill -0 "$4" 2>/dev/null; then
      grep -qE "$2" "$1" 2>/dev/null && return 0
      echo "no line matching '$2' in $1: its writer has exited" >&2
      return 1
    fi
    sleep 0.05
  done
  echo "no line matching '$2' in $1 after $3 s" >&2
  return 1
}

# wait_listen I PID PORTS: waits (at most 5 s) until pod I listens on a TCP port matching
# the regex PORTS (e.g. '18515|18516'); for an rdma_cm listen see cm_wait_listen. False when
# the server PID has exited meanwhile.
wait_listen() {
  local pod=$1 pid=$2 ports=$3 i
  for ((i = 0; i < 100; i++)); do
    ip netns exec "$(ff_pod_ns "$pod")" ss -ltn 2>/dev/null | grep -qE ":($ports) " && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  kill -0 "$pid" 2>/dev/null
}

# ---- several nodes ------------------------------------------------------------------------
#   underlay namespace ff<tag>u : bridge ffu (172.31.<net>.0/24)
#   node namespaces ff<tag>n<n> : eth0 172.31.<net>.<10+n> on the underlay, bridge ffbr
#                                 10.244.<net+n>.1/24 for its pods, host-gateway routes
#   pod namespaces ff<tag>n<n>p<i> : 10.244.<net+n>.<10+i>
# Each node runs its own router with its own folder ($FF_DIR/node<n>). Node links use TLS
# with certificates from scripts/ff-certs.sh in $FF_DIR/tls (outside every node's folder,
# which pods see); FF_INSECURE_NODE_LINKS=1 runs them in plaintext instead.

FF_MN_NS=()
declare -A FF_NODE_ROUTER=()

mn_node_ns() { echo "ff${FF_TAG}n$1"; }
mn_node_ip() { echo "172.31.${FF_NET}.$((10 + $1))"; }
mn_pod_ns() { echo "ff${FF_TAG}n$1p$2"; }
mn_pod_ip() { echo "10.244.$((FF_NET + $1)).$((10 + $2))"; }
mn_dir() { echo "$FF_DIR/node$1"; }

# multinode_up NODES PODS_PER_NODE
multinode_up() {
  local nodes=$1 pods=$2 n m i ns
  FF_DIR=$(mktemp -d /tmp/freeflow-test.XXXXXX)
  local u="ff${FF_TAG}u"
  ip netns add "$u"
  FF_MN_NS+=("$u")
  ip -n "$u" link add ffu type bridge
  ip -n "$u" link set ffu up
  for ((n = 0; n < nodes; n++)); do
    ns=$(mn_node_ns "$n")
    ip netns add "$ns"
    FF_MN_NS+=("$ns")
    mkdir -p "$(mn_dir "$n")"
    chmod 0755 "$(mn_dir "$n")"  # the router refuses a folder others can write
    ip -n "$ns" link set lo up
    ip link add "fu${FF_TAG}x$n" type veth peer name eth0 netns "$ns"
    ip link set "fu${FF_TAG}x$n" netns "$u"
    ip -n "$u" link set "fu${FF_TAG}x$n" master ffu up
    ip -n "$ns" addr add "$(mn_node_ip "$n")/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link add ffbr type bridge
    ip -n "$ns" addr add "10.244.$((FF_NET + n)).1/24" dev ffbr
    ip -n "$ns" link set ffbr up
    ip netns exec "$ns" sysctl -qw net.ipv4.ip_forward=1
    for ((i = 0; i < pods; i++)); do
      local pns
      pns=$(mn_pod_ns "$n" "$i")
      ip netns add "$pns"
      FF_MN_NS+=("$pns")
      ip -n "$pns" link set lo up
      ip link add "fp${FF_TAG}x${n}x$i" type veth peer name eth0 netns "$pns"
      ip link set "fp${FF_TAG}x${n}x$i" netns "$ns"
      ip -n "$ns" link set "fp${FF_TAG}x${n}x$i" master ffbr up
      ip -n "$pns" addr add "$(mn_pod_ip "$n" "$i")/24" dev eth0
      ip -n "$pns" link set eth0 up
      ip -n "$pns" route add default via "10.244.$((FF_NET + n)).1"
    done
  done
  for ((n = 0; n < nodes; n++)); do
    for ((m = 0; m < nodes; m++)); do
      [[ $n -eq $m ]] && continue
      ip -n "$(mn_node_ns "$n")" route add "10.244.$((FF_NET + m)).0/24" via "$(mn_node_ip "$m")"
    done
  done
  # The static control plane: which node holds which pod subnet.
  {
    echo '{"nodes": ['
    for ((n = 0; n < nodes; n++)); do
      [[ $n -gt 0 ]] && echo ','
      printf '{"name": "node%d", "address": "%s", "port": 7471, "podCIDRs": ["10.244.%d.0/24"]}' \
        "$n" "$(mn_node_ip "$n")" "$((FF_NET + n))"
    done
    echo ']}'
  } >"$FF_DIR/cluster.json"
}

# mn_tls_args NAME: the ffrouter flags for node NAME's certificate (made on first use).
mn_tls_args() {
  local name=$1 tls=$FF_DIR/tls
  if [[ ${FF_INSECURE_NODE_LINKS:-0} == 1 ]]; then
    echo --insecure-node-links
    return
  fi
  [[ -f $tls/ca.crt ]] || "$FF_SRC/scripts/ff-certs.sh" "$tls" ca >/dev/null
  [[ -f $tls/$name.crt ]] || "$FF_SRC/scripts/ff-certs.sh" "$tls" node "$name" >/dev/null
  echo --tls-ca "$tls/ca.crt" --tls-cert "$tls/$name.crt" --tls-key "$tls/$name.key"
}

# mn_router_start N [ffrouter args...]: (re)starts node N's router without waiting for it
# (its PID in FF_NODE_ROUTER[N]); default control plane is the static file. Its node name
# is node<N>, or $FF_MN_NODE_NAME when set.
mn_router_start() {
  local n=$1
  shift
  local dir name=${FF_MN_NODE_NAME:-node$n} tls_args
  dir=$(mn_dir "$n")
  read -ra tls_args <<<"$(mn_tls_args "$name")"
  rm -f "$dir/ffrouter.sock"  # a killed router's socket; wait for the new one
  # shellcheck disable=SC2086,SC2046  # FF_ROUTER_WRAP is a command line (a wrapper and its
  # flags); ff_quota_args is no flag, or one without spaces
  ip netns exec "$(mn_node_ns "$n")" ${FF_ROUTER_WRAP:-} "$FF_BUILD/router/ffrouter" --dir "$dir" --name ffrouter \
    --vnet-prefix 10.244.0.0/16 --host-ip "$(mn_node_ip "$n")" --port 7471 --node-name "$name" $(ff_quota_args) \
    --log-level "${FF_ROUTER_LOG:-info}" "${FF_CONTROL_PLANE_ARGS[@]:---control-plane=static:$FF_DIR/cluster.json}" \
    "${tls_args[@]}" "$@" >>"$dir/router.log" 2>&1 &
  FF_NODE_ROUTER[$n]=$!
}

# mn_router_up N [ffrouter args...]: mn_router_start, then waits until the router serves.
mn_router_up() {
  mn_router_start "$@"
  wait_router "${FF_NODE_ROUTER[$1]}" "$(mn_dir "$1")"
}

mn_router_down() {
  local n=$1 sig=${2:-TERM}
  local pid=${FF_NODE_ROUTER[$n]:-}
  [[ -z "$pid" ]] && return 0
  kill "-$sig" "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  FF_NODE_ROUTER[$n]=""
}

# mn_pair SERVER_NODE SERVER_POD CLIENT_NODE CLIENT_POD CMD...: CMD as a server in one pod
# and as its client (given the server's address) in another. 0 when both succeed; else
# the tails of both logs are printed. The client's output stays in $FF_DIR/client.log. A
# pair whose perftest could not measure the CPU clock runs once more (perftest_clock_failed).
mn_pair() { again_if_perftest_clock_failed mn_pair_once "$@"; }
# log_tail FILE: the end of a tool's log without its address lines. A tool's stdout reaches
# a file only at exit, after what it wrote to stderr: an error message sits above a long
# list of addresses (ibv_srq_pingpong prints 32), which a plain tail hides.
log_tail() { grep -v ' address: ' "$1" | tail -n 12; }
mn_pair_once() {
  local sn=$1 sp=$2 cn=$3 cp=$4
  shift 4
  mn_pod_bg "$sn" "$sp" "$@" >"$FF_DIR/server.log" 2>&1
  local spid=$FF_LAST_PID i
  for ((i = 0; i < 100; i++)); do
    ip netns exec "$(mn_pod_ns "$sn" "$sp")" ss -ltn 2>/dev/null | grep -qE ':(18515|18516|19[0-9]{3}) ' && break
    sleep 0.05
  done
  mn_pod_run "$cn" "$cp" timeout 90 "$@" "$(mn_pod_ip "$sn" "$sp")" >"$FF_DIR/client.log" 2>&1
  local c=$?
  wait_pid "$spid" 30
  local s=$?
  [[ $c -ne 0 || $s -ne 0 ]] && { echo "--- server (exit $s)"; log_tail "$FF_DIR/server.log"; echo "--- client (exit $c)"; log_tail "$FF_DIR/client.log"; }
  [[ $c -eq 0 && $s -eq 0 ]]
}

# mn_etcd_up: starts etcd in the underlay namespace, listening at $(mn_etcd_url); a restart
# reuses the data directory, as a real etcd restart would. Its PID is FF_ETCD_PID;
# multinode_down stops it and removes its data. With FF_ETCD_SECURE=1 it serves https only
# and requires client certificates (--client-cert-auth), with certificates that
# scripts/ff-certs.sh makes in $FF_ETCD_DIR/pki: ca, etcd (its address as an IP name),
# root, and node0..node3; turning authentication on is left to the caller (mn_etcdctl).
FF_ETCD_PID=""
FF_ETCD_DIR=""
mn_etcd_ip() { echo "172.31.${FF_NET}.2"; }
mn_etcd_url() {
  if [[ ${FF_ETCD_SECURE:-0} == 1 ]]; then echo "https://$(mn_etcd_ip):2379"; else echo "http://$(mn_etcd_ip):2379"; fi
}
mn_etcd_up() {
  FF_ETCD_DIR=${FF_ETCD_DIR:-$(mktemp -d /tmp/freeflow-etcd.XXXXXX)}
  local pki=$FF_ETCD_DIR/pki server_tls=() curl_tls=()
  if [[ ${FF_ETCD_SECURE:-0} == 1 ]]; then
    if [[ ! -f $pki/ca.crt ]]; then
      bash "$FF_SRC/scripts/ff-certs.sh" "$pki" ca >/dev/null &&
        bash "$FF_SRC/scripts/ff-certs.sh" -i "$(mn_etcd_ip)" "$pki" node etcd >/dev/null &&
        bash "$FF_SRC/scripts/ff-certs.sh" "$pki" node root node0 node1 node2 node3 >/dev/null || return 1
    fi
    server_tls=(--cert-file "$pki/etcd.crt" --key-file "$pki/etcd.key" --trusted-ca-file "$pki/ca.crt" --client-cert-auth)
    curl_tls=(--cacert "$pki/ca.crt" --cert "$pki/root.crt" --key "$pki/root.key")
  fi
  # etcd listens on the underlay bridge's side: give the underlay namespace an address.
  ip -n "ff${FF_TAG}u" link set lo up
  ip -n "ff${FF_TAG}u" addr add "$(mn_etcd_ip)/24" dev ffu 2>/dev/null
  ip netns exec "ff${FF_TAG}u" etcd --name ff --data-dir "$FF_ETCD_DIR/data" \
    --listen-client-urls "$(mn_etcd_url)" --advertise-client-urls "$(mn_etcd_url)" \
    --listen-peer-urls "http://127.0.0.1:2380" --initial-advertise-peer-urls "http://127.0.0.1:2380" \
    --initial-cluster "ff=http://127.0.0.1:2380" --heartbeat-interval=10 --election-timeout=100 \
    "${server_tls[@]}" >>"$FF_ETCD_DIR/etcd.log" 2>&1 &
  FF_ETCD_PID=$!
  local i
  for ((i = 0; i < 100; i++)); do
    ip netns exec "ff${FF_TAG}u" curl -sf "${curl_tls[@]}" "$(mn_etcd_url)/health" >/dev/null 2>&1 && return 0
    sleep 0.05
  done
  echo "etcd did not start"; tail -n 20 "$FF_ETCD_DIR/etcd.log"
  return 1
}

# mn_etcd_down: stops etcd, keeping its data for the next mn_etcd_up.
mn_etcd_down() {
  [[ -z "$FF_ETCD_PID" ]] && return 0
  kill "$FF_ETCD_PID" 2>/dev/null
  wait "$FF_ETCD_PID" 2>/dev/null
  FF_ETCD_PID=""
}

# mn_etcdctl COMMAND...: runs COMMAND (etcdctl, or a script calling it) in the underlay
# namespace with etcdctl's environment pointing at mn_etcd_up's etcd, as root (its
# certificate) when FF_ETCD_SECURE=1.
mn_etcdctl() {
  local env=(ETCDCTL_API=3 "ETCDCTL_ENDPOINTS=$(mn_etcd_url)" ETCDCTL_COMMAND_TIMEOUT=5s)
  [[ ${FF_ETCD_SECURE:-0} == 1 ]] && env+=("ETCDCTL_CACERT=$FF_ETCD_DIR/pki/ca.crt"
    "ETCDCTL_CERT=$FF_ETCD_DIR/pki/root.crt" "ETCDCTL_KEY=$FF_ETCD_DIR/pki/root.key")
  ip netns exec "ff${FF_TAG}u" env "${env[@]}" "$@"
}

# mn_etcd_get KEY [etcdctl get flags...]: what `etcdctl get` prints about KEY.
mn_etcd_get() { mn_etcdctl etcdctl get "$@"; }

mn_pod_run() {
  local n=$1 i=$2
  shift 2
  ip netns exec "$(mn_pod_ns "$n" "$i")" env FREEFLOW_DIR="$(mn_dir "$n")" FFR_NAME=ffrouter \
    LD_PRELOAD="$(mn_dir "$n")/libffverbs.so" "$@"
}

mn_pod_bg() {
  local n=$1 i=$2
  shift 2
  ip netns exec "$(mn_pod_ns "$n" "$i")" env FREEFLOW_DIR="$(mn_dir "$n")" FFR_NAME=ffrouter \
    LD_PRELOAD="$(mn_dir "$n")/libffverbs.so" "$@" &
  FF_LAST_PID=$!
  FF_PIDS+=("$FF_LAST_PID")
}

multinode_down() {
  local p n
  for p in "${FF_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${FF_PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  FF_PIDS=()
  for n in "${!FF_NODE_ROUTER[@]}"; do mn_router_down "$n"; done
  mn_etcd_down
  [[ -n "$FF_ETCD_DIR" ]] && rm -rf "$FF_ETCD_DIR"
  FF_ETCD_DIR=""
  for ((p = ${#FF_MN_NS[@]} - 1; p >= 0; p--)); do ip netns del "${FF_MN_NS[$p]}" 2>/dev/null || true; done
  FF_MN_NS=()
  [[ -n "$FF_DIR" ]] && { [[ -n ${FF_KEEP_LOGS:-} ]] && cp -r "$FF_DIR" "$FF_KEEP_LOGS"; rm -rf "$FF_DIR"; }
  FF_DIR=""
}

# ---- two pods, on one node or on two --------------------------------------------------------
# What runs the same pairs on one node and across nodes addresses its pods the one-node way
# (ff_pod_ip, ff_pod_ns, pod_bg, pod_run with 0 and 1) in both placements.

# pods_on_nodes: from now on pod I means pod 0 of node I (the one-node helpers redefined).
# shellcheck disable=SC2317  # the helpers it defines are called later, by the scripts
pods_on_nodes() {
  ff_pod_ns() { mn_pod_ns "$1" 0; }
  ff_pod_ip() { mn_pod_ip "$1" 0; }
  pod_bg() {
    local n=$1
    shift
    mn_pod_bg "$n" 0 "$@"
  }
  pod_run() {
    local n=$1
    shift
    mn_pod_run "$n" 0 "$@"
  }
}

# two_pods_up same|cross [ffrouter args...]: pods 0 and 1 and their routers: two pods of one
# node (same), or one pod on each of two nodes with TLS node links (cross). With
# FF_KNOWN_PODS=1 the one-node router has a control plane too (router_up_known_pods).
# Callers trap two_pods_down on EXIT.
FF_PLACEMENT=""
two_pods_up() {
  FF_PLACEMENT=$1
  shift
  local up=router_up
  [[ ${FF_KNOWN_PODS:-0} == 1 ]] && up=router_up_known_pods
  case $FF_PLACEMENT in
    same) cluster_up 2 && $up "$@" ;;
    cross) multinode_up 2 1 && pods_on_nodes && mn_router_up 0 "$@" && mn_router_up 1 "$@" ;;
    *) echo "two_pods_up: same or cross, not '$FF_PLACEMENT'" >&2 && return 2 ;;
  esac
}
two_pods_down() {
  case $FF_PLACEMENT in
    same) cluster_down ;;
    cross) multinode_down ;;
  esac
  FF_PLACEMENT=""
}
# pod_router_log I: the log of the router serving pod I.
pod_router_log() {
  if [[ $FF_PLACEMENT == cross ]]; then echo "$FF_DIR/node$1/router.log"; else echo "$FF_DIR/router.log"; fi
}
# cm_listen_mark I: where the log of pod I's router ends now; cm_wait_listen I PID MARK:
# waits (at most 5 s) until that router logs, after MARK, that pod I listens with rdma_cm
# (an rdma_cm listen shows in no socket table; the router must log at level info,
# FF_ROUTER_LOG=info). False when PID has exited meanwhile or the listen never came.
# shellcheck disable=SC2002  # cat, so that a missing log counts 0 lines
cm_listen_mark() { cat "$(pod_router_log "$1")" 2>/dev/null | wc -l; }
cm_wait_listen() {
  local log i
  log=$(pod_router_log "$1")
  for ((i = 0; i < 100; i++)); do
    tail -n +$(($3 + 1)) "$log" | grep -q "rdma_cm listens on $(ff_pod_ip "$1"):" && break
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.05
  done
  ((i < 100)) && kill -0 "$2" 2>/dev/null
}
# perftest_lost_race LOG...: a perftest -R client that logged to LOG was rejected for want
# of a listener (reason 8): perftest's own race, for which the pair is run again
# (again_if_perftest_raced in tests/integration/rdmacm/rdmacm.sh, perftest_run in measure.sh).
perftest_lost_race() { grep -q 'RDMA_CM_EVENT_REJECTED; error: 8' "$@" 2>/dev/null; }
# perftest_cm_pair LOG ADDR:PORT CLIENT_LOG START_SERVER START_CLIENT: a perftest -R pair
# that the caller's functions START_SERVER and START_CLIENT start (each in the background,
# its pid in FF_LAST_PID; the client's output in CLIENT_LOG), the client once the router's
# LOG shows the server listening on ADDR:PORT. perftest -R meets twice, and its client can
# lose perftest's race to the server's second listen (perftest_lost_race); the pair then
# starts again, 5 times at most. Any other failure is the caller's to find. Pids: CM_S, CM_C.
perftest_cm_pair() {
  local log=$1 at=$2 attempt before i
  for ((attempt = 1; attempt <= 5; attempt++)); do
    before=$(grep -c "rdma_cm listens on $at" "$log")
    "$4"
    CM_S=$FF_LAST_PID
    for ((i = 0; i < 100; i++)); do
      (($(grep -c "rdma_cm listens on $at" "$log") > before)) && break
      sleep 0.05
    done
    "$5"
    CM_C=$FF_LAST_PID
    sleep 1.5
    kill -0 "$CM_C" 2>/dev/null || ! perftest_lost_race "$3" && return 0
    echo "perftest -R: the client lost perftest's race (run $attempt); the pair again"
    kill "$CM_S" 2>/dev/null
    wait "$CM_S" "$CM_C" 2>/dev/null
  done
}
# pod_router_kill I [SIGNAL]: stops the router serving pod I (TERM by default).
pod_router_kill() {
  if [[ $FF_PLACEMENT == cross ]]; then mn_router_down "$1" "${2:-TERM}"; else router_down "${2:-TERM}"; fi
}
# pod_router_start I [ffrouter args...]: starts pod I's router again after pod_router_kill,
# as two_pods_up did.
pod_router_start() {
  local n=$1
  shift
  if [[ $FF_PLACEMENT == cross ]]; then
    mn_router_up "$n" "$@"
  elif [[ ${FF_KNOWN_PODS:-0} == 1 ]]; then
    router_up_known_pods "$@"
  else
    router_up "$@"
  fi
}

# handover_window LOG: "FROM TO" in Unix seconds, the window in which programs may have
# waited for the hand-over the old router's LOG reports last ("handed over to a successor:
# ..., paused N ms", logged when it finished): from the start of its pause (and 0.1 s before,
# for the clocks' resolution) to 1 s after it, while the successor links to the other nodes.
handover_window() {
  local line at ms
  line=$(grep -h "handed over to a successor" "$1" | tail -n 1)
  at=$(date -d "${line%% *}" +%s.%N 2>/dev/null) || return 1
  ms=$(grep -oE "paused [0-9]+ ms" <<<"$line" | grep -oE "[0-9]+")
  awk -v at="$at" -v ms="${ms:-0}" 'BEGIN { printf "%.3f %.3f\n", at - ms / 1000 - 0.1, at + 1 }'
}

# pauses_of LABEL [NAME=]waits:LOG | [NAME=]iperf3:JSON:STARTED ...: one line, "  LABEL: " and
# the pause each program saw across the hand-over window FF_HANDOVER_WINDOW (handover_window),
# which scripts/lib/pauses.py reads from what it wrote: a verbs program's FFV_REPORT_WAITS
# report, an iperf3 client's intervals (STARTED: when it started, in Unix seconds). Each after
# "NAME: " when given, "; " between them. The figure or why there is none; never fails.
pauses_of() {
  local line="  $1:" sep="" spec name file started
  local -a window
  read -ra window <<<"${FF_HANDOVER_WINDOW:-}"
  shift
  for spec in "$@"; do
    name=""
    if [[ ${spec%%:*} == *=* ]]; then
      name="${spec%%=*}: "
      spec=${spec#*=}
    fi
    file=${spec#*:}
    if [[ ${spec%%:*} == iperf3 ]]; then
      started=${file##*:}
      file=${file%:*}
      line+="$sep $name$(python3 "$FF_SRC/scripts/lib/pauses.py" iperf3 "$file" "$started" "${window[@]}")"
    else
      line+="$sep $name$(python3 "$FF_SRC/scripts/lib/pauses.py" waits "$file" "${window[@]}")"
    fi
    sep=";"
  done
  echo "$line"
}

# perftest_clock_failed LOG...: true when perftest could not measure the CPU clock (it samples
# cycles against gettimeofday and gives up, "Correlation coefficient r^2: ... < 0.9", when
# the machine is too busy for the samples to line up; it then exits 1 without a report).
# That is perftest's measurement failing, not the transfer: the tests run such a pair again.
perftest_clock_failed() {
  grep -qs "Correlation coefficient r^2" "$@"
}

# again_if_perftest_clock_failed CMD...: runs CMD, a pair that leaves its logs in
# $FF_DIR/client.log and server.log (and perhaps its stderr in client.err and server.err),
# and once more when it failed that way; its status.
again_if_perftest_clock_failed() {
  "$@"
  local st=$?
  if [[ $st -ne 0 ]] && perftest_clock_failed "$FF_DIR"/{client,server}.{log,err}; then
    echo "perftest could not measure the CPU clock on this busy machine; running the pair again"
    "$@"
    st=$?
  fi
  return $st
}
