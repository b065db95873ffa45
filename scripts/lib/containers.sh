# shellcheck shell=bash
# Helpers for the end-to-end run on a real container runtime (tests/e2e/run.sh): a private
# containerd, CNI pod networks inside "node" network namespaces, and the containers a
# kubelet would start. Nothing here touches a system containerd or the host's network:
#
#   $CT_DIR (a temp dir)   containerd's root, state, socket and config; runc's root; CNI
#                          address leases; the nodes' /freeflow folders and kubelet folders
#   node namespace  ffe<tag>n<n> : CNI bridge ffe<tag>b<n> (10.244.<net+n>.1/24), routers
#   pod namespaces  ffe<tag>n<n>p<i> : eth0 from the CNI bridge plugin, host-local address
#   underlay namespace ffe<tag>u : bridge ffu (172.31.<net>.0/24) joining several nodes,
#                                  each at 172.31.<net>.<10+n> with routes to the others' pods
#
# Everything is recorded as it is made and removed by ct_down, which the caller traps on
# EXIT. Processes are only ever stopped by the PID this file started.
# (containerd-shim-runc-v2 keeps its socket under /run/containerd/s, a path it does not let
# a client change; the shims and their sockets go when their containers go.)

CT_TAG=${CT_TAG:-$$}
CT_NET=${CT_NET:-$(((CT_TAG % 120) + 40))}
CT_NS=freeflow-e2e
CT_DIR=""
CT_CONTAINERD_PID=""
CT_NETNS=()      # network namespaces made here
CT_CONTAINERS=() # containers made here (deleted with their tasks and snapshots)
CT_CNI=()        # "node|netns|id" of every CNI ADD, for its DEL
CT_PIDS=()       # other processes the caller started for the run (etcd), stopped first
CNI_BIN=${CNI_BIN:-/usr/lib/cni}
FF_CT_LIB=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

ct_node_ns() { echo "ffe${CT_TAG}n$1"; }
ct_node_ip() { echo "172.31.$CT_NET.$((10 + $1))"; }
ct_pod_ns() { echo "ffe${CT_TAG}n$1p$2"; }
ct_node_gw() { echo "10.244.$((CT_NET + $1)).1"; }

# ct_up: a private containerd under a new temp dir, waited for (bounded).
ct_up() {
  [[ -d /run/containerd ]] || CT_RUN_DIR_MADE=1
  CT_DIR=$(mktemp -d /tmp/freeflow-e2e.XXXXXX)
  mkdir -p "$CT_DIR/root" "$CT_DIR/state" "$CT_DIR/runc" "$CT_DIR/fifo" "$CT_DIR/cni"
  cat >"$CT_DIR/containerd.toml" <<EOF
version = 2
root = "$CT_DIR/root"
state = "$CT_DIR/state"
# No CRI (there is no kubelet here) and no snapshotters this machine cannot use.
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing"]
[grpc]
  address = "$CT_DIR/containerd.sock"
[ttrpc]
  address = "$CT_DIR/containerd.sock.ttrpc"
[debug]
  address = "$CT_DIR/debug.sock"
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$CT_DIR/opt"
EOF
  containerd --config "$CT_DIR/containerd.toml" --log-level warn >"$CT_DIR/containerd.log" 2>&1 &
  CT_CONTAINERD_PID=$!
  local tries=0
  until ct namespaces ls >/dev/null 2>&1; do  # at most 10 s, while it runs
    if ((++tries > 200)) || ! kill -0 "$CT_CONTAINERD_PID" 2>/dev/null; then
      echo "containerd did not start:" >&2
      cat "$CT_DIR/containerd.log" >&2
      return 1
    fi
    sleep 0.05
  done
}

# ct ARGS...: ctr against the private containerd, in the e2e's containerd namespace.
ct() { ctr --address "$CT_DIR/containerd.sock" --namespace "$CT_NS" "$@"; }

# ct_import ARCHIVE: imports (and unpacks) the OCI archive scripts/images.sh makes; its
# images are then freeflow-router:TAG and freeflow-app:TAG.
ct_import() { ct images import "$1" >/dev/null; }

# ct_node_up N: the network namespace of node N (its "host network").
ct_node_up() {
  local ns
  ns=$(ct_node_ns "$1")
  ip netns add "$ns"
  CT_NETNS+=("$ns")
  ip -n "$ns" link set lo up
}

# ct_nodes_link N...: joins nodes N... on an underlay network (the "node network"): each
# gets eth0 at ct_node_ip N, forwards, and routes the other nodes' pod subnets to them.
ct_nodes_link() {
  local u="ffe${CT_TAG}u" n m ns
  ip netns add "$u"
  CT_NETNS+=("$u")
  ip -n "$u" link add ffu type bridge
  ip -n "$u" link set ffu up
  for n in "$@"; do
    ns=$(ct_node_ns "$n")
    ip link add "fue${CT_TAG}x$n" type veth peer name eth0 netns "$ns"
    ip link set "fue${CT_TAG}x$n" netns "$u"
    ip -n "$u" link set "fue${CT_TAG}x$n" master ffu up
    ip -n "$ns" addr add "$(ct_node_ip "$n")/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip netns exec "$ns" sysctl -qw net.ipv4.ip_forward=1
  done
  for n in "$@"; do
    for m in "$@"; do
      [[ $n == "$m" ]] && continue
      ip -n "$(ct_node_ns "$n")" route add "10.244.$((CT_NET + m)).0/24" via "$(ct_node_ip "$m")"
    done
  done
}

# ct_cni_conf N: the CNI network of node N: a bridge with host-local addresses, as a
# cluster's bridge CNI gives every pod of a node one address of the node's pod CIDR.
ct_cni_conf() {
  local net=$((CT_NET + $1))
  cat <<EOF
{"cniVersion": "1.0.0", "name": "ffe${CT_TAG}n$1", "type": "bridge",
 "bridge": "ffe${CT_TAG}b$1", "isGateway": true, "ipMasq": false, "hairpinMode": false,
 "ipam": {"type": "host-local", "dataDir": "$CT_DIR/cni",
          "ranges": [[{"subnet": "10.244.$net.0/24", "rangeStart": "10.244.$net.10",
                       "gateway": "10.244.$net.1"}]],
          "routes": [{"dst": "0.0.0.0/0"}]}}
EOF
}

# ct_cni COMMAND NODE NETNS ID: runs the bridge plugin inside the node's namespace as a
# runtime does for a pod sandbox; prints the plugin's JSON result.
ct_cni() {
  ct_cni_conf "$2" | ip netns exec "$(ct_node_ns "$2")" env CNI_COMMAND="$1" \
    CNI_CONTAINERID="$4" CNI_NETNS="/run/netns/$3" CNI_IFNAME=eth0 CNI_PATH="$CNI_BIN" \
    timeout 20 "$CNI_BIN/bridge"
}

# ct_pod_net NODE I: the pod sandbox's network namespace with its CNI address, which it
# leaves in CT_POD_IP (not printed: what is made here must be recorded by this shell).
ct_pod_net() {
  local ns out
  ns=$(ct_pod_ns "$1" "$2")
  ip netns add "$ns"
  CT_NETNS+=("$ns")
  ip -n "$ns" link set lo up
  CT_CNI+=("$1|$ns|$ns")
  out=$(ct_cni ADD "$1" "$ns" "$ns") || {
    echo "CNI ADD for $ns failed: $out" >&2
    return 1
  }
  # shellcheck disable=SC2034  # read by the caller
  CT_POD_IP=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["ips"][0]["address"].split("/")[0])' <<<"$out")
}

# ct_run ID IMAGE_REF [ctr run options...] -- CMD...: starts a detached container (recorded for
# ct_down) whose task's output goes to $CT_DIR/ID.log. runc runs through runc-cri: as under
# containerd's CRI, the container has no rlimits of its own and inherits containerd's.
ct_run() {
  local id=$1 image=$2
  shift 2
  local opts=()
  while [[ $# -gt 0 && $1 != -- ]]; do
    opts+=("$1")
    shift
  done
  shift
  CT_CONTAINERS+=("$id")
  ct run -d --runc-binary "$FF_CT_LIB/runc-cri" --runc-root "$CT_DIR/runc" --fifo-dir "$CT_DIR/fifo" --log-uri "file://$CT_DIR/$id.log" \
    "${opts[@]}" "$image" "$id" "$@" >/dev/null
}

# ct_no_caps: ctr run options that drop every capability of containerd's default set (ctr
# takes no "ALL"), as a pod's `capabilities: {drop: [ALL]}` does.
ct_no_caps() {
  ctr oci spec | python3 -c 'import json, sys
for c in json.load(sys.stdin)["process"]["capabilities"]["bounding"]: print("--cap-drop", c)'
}

# ct_pid ID: the host PID of the container's task.
ct_pid() { ct task ls | awk -v id="$1" '$1 == id {print $2}'; }

# ct_wait ID SECONDS: waits (bounded) for the task to exit and deletes it; prints its exit
# status (124 when it was still running: then it is killed; 127 when there is no task).
ct_wait() {
  local i rc=0
  ct task ls | awk -v id="$1" '$1 == id {f = 1} END {exit !f}' || {
    echo "no task $1" >&2
    echo 127
    return 0
  }
  for ((i = 0; i < $2 * 20; i++)); do
    if ct task ls | awk -v id="$1" '$1 == id && $3 == "STOPPED" {f = 1} END {exit !f}'; then
      # ctr exits with the task's exit status.
      ct task delete "$1" >/dev/null 2>&1 || rc=$?
      ct_log_settled "$1"
      echo "$rc"
      return 0
    fi
    sleep 0.05
  done
  ct task kill -s KILL "$1" 2>/dev/null || true
  echo 124
}

# ct_log_settled ID: waits (at most 2 s) until the container's log stops growing: the shim
# copies the task's output into it on its own, and may still be at it when the task is gone.
ct_log_settled() {
  local i size last=-1
  for ((i = 0; i < 40; i++)); do
    size=$(stat -c %s "$CT_DIR/$1.log" 2>/dev/null || echo 0)
    [[ $size == "$last" ]] && return 0
    last=$size
    sleep 0.05
  done
}

# ct_rm ID: stops and removes one container, its task and its snapshot.
ct_rm() {
  local i
  if ct task ls 2>/dev/null | awk -v id="$1" '$1 == id && $3 != "STOPPED" {f = 1} END {exit !f}'; then
    ct task kill -s KILL "$1" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
      ct task ls | awk -v id="$1" '$1 == id && $3 == "STOPPED" {f = 1} END {exit !f}' && break
      sleep 0.05
    done
  fi
  ct task delete "$1" >/dev/null 2>&1 || true
  ct containers delete "$1" >/dev/null 2>&1 || true
}

ct_down() {
  local c entry node ns id p
  for p in "${CT_PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${CT_PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  CT_PIDS=()
  if [[ -n $CT_DIR ]]; then
    for c in "${CT_CONTAINERS[@]}"; do ct_rm "$c"; done
    for entry in "${CT_CNI[@]}"; do
      IFS='|' read -r node ns id <<<"$entry"
      ct_cni DEL "$node" "$ns" "$id" >/dev/null 2>&1 || true
    done
  fi
  CT_CONTAINERS=()
  CT_CNI=()
  for ns in "${CT_NETNS[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
  CT_NETNS=()
  if [[ -n $CT_CONTAINERD_PID ]]; then
    kill "$CT_CONTAINERD_PID" 2>/dev/null || true
    wait "$CT_CONTAINERD_PID" 2>/dev/null || true
    CT_CONTAINERD_PID=""
  fi
  if [[ -n $CT_DIR ]]; then
    # Snapshots are overlay mounts under the root; none may be left mounted.
    { grep -o " $CT_DIR/[^ ]*" /proc/mounts || true; } | sort -r |
      while read -r m; do umount -l "$m" || true; done
    rm -rf "$CT_DIR"
  fi
  CT_DIR=""
  # The shims' socket folder, when this run made it and nothing else uses it.
  if [[ -n ${CT_RUN_DIR_MADE:-} ]]; then
    rmdir /run/containerd/s /run/containerd/fifo /run/containerd 2>/dev/null || true
  fi
}
