# Shared helpers for integration tests, the demo and the benchmarks: a one-node
# "cluster" made of network namespaces on this machine.
#
#   node namespace  ff<tag>n : bridge ffbr (10.244.<net>.1/24), runs ffrouter
#   pod namespaces  ff<tag>p<i> : eth0 (10.244.<net>.<10+i>/24), veth to the bridge
#
# Everything created is recorded and removed by cluster_down (also on EXIT when the
# caller traps it). Processes are only ever stopped by the PID this file started.

FF_BUILD=${FF_BUILD:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/build}
FF_TAG=${FF_TAG:-$$}
FF_NET=${FF_NET:-$(( (FF_TAG % 200) + 20 ))}
FF_NODE=ff${FF_TAG}n
FF_DIR=""
FF_ROUTER_PID=""
FF_PODS=()
FF_PIDS=()

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
  ip netns exec "$FF_NODE" "$FF_BUILD/router/ffrouter" --dir "$FF_DIR" --name ffrouter \
    --vnet-prefix 10.244.0.0/16 --log-level "${FF_ROUTER_LOG:-warn}" "$@" \
    >>"$FF_DIR/router.log" 2>&1 &
  FF_ROUTER_PID=$!
  local i
  for ((i = 0; i < 200; i++)); do
    [[ -S "$FF_DIR/ffrouter.sock" && -f "$FF_DIR/libffverbs.so" ]] && return 0
    kill -0 "$FF_ROUTER_PID" 2>/dev/null || break
    sleep 0.02
  done
  echo "router did not start:" >&2
  cat "$FF_DIR/router.log" >&2
  return 1
}

router_down() {
  if [[ -n "$FF_ROUTER_PID" ]]; then
    kill "$FF_ROUTER_PID" 2>/dev/null || true
    wait "$FF_ROUTER_PID" 2>/dev/null || true
    FF_ROUTER_PID=""
  fi
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
