# shellcheck shell=bash
# The end-to-end run's steps (tests/e2e/run.sh): kubelet's part for DaemonSets and app
# containers, and the checks. Needs scripts/lib/containers.sh and scripts/lib/measure.sh,
# and run.sh's SRC and TAG. Node N's root folder (where its hostPaths are) is
# $CT_DIR/node<N>; kubelet's Allocate answer is $CT_DIR/allocate.json (the device plugin
# answers the same on every node in virtual mode).

E2E_STARTS=()

step() { echo "== $*"; }
ok() { echo "   ok: $*"; }
# fail WHAT LOG...: says what failed, shows the logs, and exits (the EXIT trap cleans up).
fail() {
  local what=$1 f
  shift
  echo "e2e: FAIL $what" >&2
  for f in "$@"; do
    echo "---- $f" >&2
    tail -n 30 "$f" >&2 2>/dev/null || true
  done
  echo "e2e: 0 passed, 1 failed"
  exit 1
}

# wait_for SECONDS CMD...: true once CMD succeeds, polled every 50 ms for at most SECONDS.
wait_for() {
  local limit=$1 i
  shift
  for ((i = 0; i < limit * 20; i++)); do
    "$@" 2>/dev/null && return 0
    sleep 0.05
  done
  return 1
}

# e2e_time CMD...: runs CMD; its wall time in milliseconds is left in E2E_MS.
e2e_time() {
  local t0
  t0=$(date +%s%N)
  "$@"
  # shellcheck disable=SC2034  # read by the caller
  E2E_MS=$((($(date +%s%N) - t0) / 1000000))
}

node_root() { echo "$CT_DIR/node$1"; }

# e2e_daemonset ID DAEMONSET IMAGE NODE MANIFEST: starts the DaemonSet's container on node
# NODE as kubelet would (host network = the node's namespace, host PID = this machine's).
e2e_daemonset() {
  local id=$1 ds=$2 image=$3 node=$4 manifest=$5 spec
  spec=$(python3 "$SRC/tests/e2e/kubelet_spec.py" daemonset "$manifest" "$ds" \
    "$(node_root "$node")" "node$node" "$(ct_node_ip "$node")" "/run/netns/$(ct_node_ns "$node")" \
    "/proc/$$/ns/pid") || fail "cannot translate DaemonSet $ds"
  local args
  mapfile -t args <<<"$spec"
  ct_run "$id" "$image" "${args[@]}" || fail "cannot start $ds" "$CT_DIR/containerd.log"
}

# app_run ID NODE:POD CMD...: an app container in pod POD of node NODE, restricted as
# deploy/examples' pods are (containerd's defaults for the rest: its own PID, IPC and mount
# namespaces, no new privileges), with kubelet's edits from the Allocate answer.
app_run() {
  local id=$1 node=${2%%:*} pod=${2#*:}
  shift 2
  local caps alloc
  mapfile -t caps < <(ct_no_caps)
  # shellcheck disable=SC2206
  caps=(${caps[@]})
  mapfile -t alloc < <(python3 "$SRC/tests/e2e/kubelet_spec.py" allocate "$CT_DIR/allocate.json" \
    "$(node_root "$node")")
  # stderr into stdout: the shim's file log loses a short-lived task's stderr at times
  # (seen with the library's refusal line), its stdout never.
  ct_run "$id" "freeflow-app:$TAG" --read-only --seccomp "${caps[@]}" \
    --with-ns "network:/run/netns/$(ct_pod_ns "$node" "$pod")" "${alloc[@]}" -- \
    sh -c 'exec "$@" 2>&1' sh "$@"
}

# app_id NAME: a container ID not used before in this run (and so a log of its own).
app_id() { echo "$1-$(date +%s%N)"; }

# app_check NODE:POD: the container is what the pod spec asked for, and freeflow works in it.
app_check() {
  local id
  id=$(app_id check)
  # shellcheck disable=SC2016  # the container's shell expands it
  app_run "$id" "$1" sh -c 'id -u; grep -E "^(CapEff|CapBnd|NoNewPrivs|Seccomp):" /proc/self/status
    echo "pid1=$(cat /proc/1/comm)"
    touch /probe 2>/dev/null && echo "root-writable"
    touch /freeflow/probe 2>/dev/null && echo "freeflow-writable"
    echo "LD_PRELOAD=$LD_PRELOAD"; ibv_devices'
  local rc
  rc=$(ct_wait "$id" 20)
  local log=$CT_DIR/$id.log
  [[ $rc == 0 ]] || fail "app check exited $rc" "$log"
  grep -qx 1000 "$log" || fail "not user 1000" "$log"
  { grep -qE '^CapEff:\s+0+$' "$log" && grep -qE '^CapBnd:\s+0+$' "$log"; } || fail "capabilities" "$log"
  { grep -qE '^NoNewPrivs:\s+1$' "$log" && grep -qE '^Seccomp:\s+2$' "$log"; } || fail "seccomp" "$log"
  grep -qx 'pid1=sh' "$log" || fail "not its own PID namespace" "$log"
  ! grep -qE 'writable' "$log" || fail "a file system pods must not write is writable" "$log"
  grep -q freeflow0 "$log" || fail "ibv_devices does not list freeflow0" "$log" "$CT_DIR/router.log"
  ok "uid 1000, no capabilities, seccomp filter, no new privileges, own PID namespace,"
  ok "read-only root and /freeflow; ibv_devices: $(grep -o 'freeflow0.*' "$log" | tr -s ' ')"
}

# e2e_start_to_verbs NODE:POD N: N times, the milliseconds from `ctr run` to the first verbs call
# of the container's program answered (ibv_get_device_list: the library's HELLO to the
# router), into E2E_STARTS.
e2e_start_to_verbs() {
  local i id t0 t1
  for ((i = 0; i < $2; i++)); do
    id=$(app_id start)
    t0=$(date +%s%N)
    app_run "$id" "$1" sh -c 'ibv_devices >/dev/null && date +%s%N'
    [[ $(ct_wait "$id" 20) == 0 ]] || fail "ibv_devices in a new container" "$CT_DIR/$id.log"
    t1=$(grep -E '^[0-9]+$' "$CT_DIR/$id.log" | tail -n 1)
    E2E_STARTS+=("$(((t1 - t0) / 1000000))")
    ct_rm "$id"
  done
}

# app_pair NAME SERVER CLIENT SECONDS CMD... -- CLIENT_EXTRA...: CMD as a server (NODE:POD)
# container in one pod and, once it listens on perftest's port 18515, CMD CLIENT_EXTRA as a
# client container in the other. Logs: $CT_DIR/NAME-s.log, NAME-c.log. False when either
# does not exit 0 within SECONDS.
app_pair() {
  local name=$1 sp=$2 cp=$3 limit=$4
  shift 4
  local cmd=() extra=()
  while [[ $1 != -- ]]; do
    cmd+=("$1")
    shift
  done
  shift
  extra=("$@")
  local s c
  s=$(app_id "$name-s")
  c=$(app_id "$name-c")
  app_run "$s" "$sp" "${cmd[@]}"
  wait_for 10 sh -c "ip netns exec $(ct_pod_ns "${sp%%:*}" "${sp#*:}") ss -ltn | grep -q ':18515 '" ||
    true
  app_run "$c" "$cp" "${cmd[@]}" "${extra[@]}"
  local crc src
  crc=$(ct_wait "$c" "$limit")
  src=$(ct_wait "$s" 10)
  cp "$CT_DIR/$s.log" "$CT_DIR/$name-s.log"
  cp "$CT_DIR/$c.log" "$CT_DIR/$name-c.log"
  ct_rm "$s"
  ct_rm "$c"
  [[ $crc == 0 && $src == 0 ]]
}

# app_perftest SERVER CLIENT SERVER_IP FIELD TOOL ARGS...: one perftest figure between two
# app containers (NODE:POD each; FIELD as perftest_run's); nothing when the run failed.
app_perftest() {
  local s=$1 c=$2 ip=$3 field=$4
  shift 4
  app_pair pt "$s" "$c" 60 "$@" -- "$ip" >/dev/null 2>&1 || return 0
  perftest_field "$field" "$CT_DIR/pt-c.log"
}

# The container of node 0's serving router (router_update starts another).
ROUTER_CT=router

# ROLLING_SCRIPT: what each app container of the rolling-update check runs. A pingpong
# long enough to be running when the router is replaced, which must end with an error, not
# hang; then, in the same container, new QPs once the new router serves: another pingpong
# (the client retries until the server listens again). Arguments: ROLE SERVER_IP.
# shellcheck disable=SC2016
ROLLING_SCRIPT='
peer=""; [ "$1" = client ] && peer=$2
ibv_rc_pingpong -g 1 -n 100000000 $peer >/dev/null 2>&1; echo "first-exit=$?"
i=0; until ibv_devices 2>/dev/null | grep -q freeflow0; do
  i=$((i + 1)); [ $i -gt 200 ] && { echo "no router again"; exit 1; }; sleep 0.05; done
i=0; until ibv_rc_pingpong -g 1 -n 1000 $peer; do
  i=$((i + 1)); [ $i -gt 40 ] && exit 1; sleep 0.25; done'

# router_update: the router DaemonSet updated to a new image as Kubernetes rolls it out
# with the shipped strategy (maxSurge 1, maxUnavailable 0): a second router container
# starts beside the serving one while two app containers run ib_send_lat for 10 s, takes
# its pods over (docs/handover.md) and turns ready (its readiness probe passes, the old
# one's no longer); then the old pod is deleted (SIGTERM), and its router must exit 0. Both
# programs must run on to their end without an error. The image is the same build under a
# second tag (this run builds one). ROUTER_CT becomes the new container; E2E_HANDOVER is the
# old router's line on it.
router_update() {
  local s c old=$ROUTER_CT new=router-next
  running() { ct task ls | awk -v id="$1" '$1 == id && $3 == "RUNNING" {f = 1} END {exit !f}'; }
  ct images tag "freeflow-router:$TAG" "freeflow-router:$TAG-next" >/dev/null ||
    fail "cannot tag the router's image"
  s=$(app_id surge-s)
  c=$(app_id surge-c)
  app_run "$s" 0:0 ib_send_lat -D 10
  wait_for 10 sh -c "ip netns exec $(ct_pod_ns 0 0) ss -ltn | grep -q ':18515 '" ||
    fail "update: no ib_send_lat server" "$CT_DIR/$s.log"
  app_run "$c" 0:1 ib_send_lat -D 10 "$POD0"
  sleep 1  # both run their QP
  e2e_daemonset "$new" freeflow-router "freeflow-router:$TAG-next" 0 "$CT_DIR/manifest.yaml"
  wait_for 20 router_probe readinessProbe "$new" ||
    fail "update: the new router is not ready" "$CT_DIR/$new.log" "$CT_DIR/$old.log"
  router_probe readinessProbe "$old" && fail "update: the old router is still ready" "$CT_DIR/$old.log"
  { running "$s" && running "$c"; } ||
    fail "update: ib_send_lat ended before the hand-over" "$CT_DIR/$s.log" "$CT_DIR/$c.log"
  # The DaemonSet controller deletes the old pod once the new one is available.
  ct task kill -s TERM "$old"
  [[ $(ct_wait "$old" 10) == 0 ]] || fail "update: the old router did not exit 0 on SIGTERM" "$CT_DIR/$old.log"
  ct_rm "$old"
  [[ $(ct_wait "$c" 30) == 0 && $(ct_wait "$s" 10) == 0 ]] ||
    fail "update: ib_send_lat failed across the update" "$CT_DIR/$s.log" "$CT_DIR/$c.log" "$CT_DIR/$new.log"
  grep -qiE 'error|fail|unable' "$CT_DIR/$s.log" "$CT_DIR/$c.log" &&
    fail "update: ib_send_lat printed an error" "$CT_DIR/$s.log" "$CT_DIR/$c.log"
  grep -q 'took over' "$CT_DIR/$new.log" || fail "update: the new router did not take over" "$CT_DIR/$new.log"
  # shellcheck disable=SC2034  # read by the caller
  E2E_HANDOVER=$(grep -ho 'handed over to a successor.*' "$CT_DIR/$old.log")
  # shellcheck disable=SC2034  # read by the caller
  E2E_UPDATE_LAT=$(grep -E '^ +[0-9]+ +[0-9]+ ' "$CT_DIR/$c.log" | tail -n 1 |
    awk '{printf "%s iterations of %s B, average %s us", $2, $1, $3}')
  ROUTER_CT=$new
  ct_rm "$s"
  ct_rm "$c"
}

# router_replacement: replaces the router container as deleting its pod does, with no
# successor beside it (SIGTERM, the grace period, a new container from the same spec) while two app
# containers run a pingpong: theirs must fail, not hang, and new QPs in the same containers
# must work with the new router. Sets E2E_FAIL_MS (router stopped to both pingpongs ended)
# and E2E_BACK_MS (new router started to its socket serving).
router_replacement() {
  local s c t0 i
  s=$(app_id roll-s)
  c=$(app_id roll-c)
  app_run "$s" 0:0 sh -c "$ROLLING_SCRIPT" roll server
  wait_for 10 sh -c "ip netns exec $(ct_pod_ns 0 0) ss -ltn | grep -q ':18515 '" ||
    fail "rolling: no server" "$CT_DIR/$s.log"
  app_run "$c" 0:1 sh -c "$ROLLING_SCRIPT" roll client "$POD0"
  sleep 1  # both run their QP
  grep -q first-exit "$CT_DIR/$c.log" && fail "rolling: the pingpong ended early" "$CT_DIR/$c.log"
  t0=$(date +%s%N)
  ct task kill -s TERM "$ROUTER_CT"
  [[ $(ct_wait "$ROUTER_CT" 10) != 124 ]] || fail "the router did not stop within its grace period"
  ct_rm "$ROUTER_CT"
  for ((i = 0; i < 200; i++)); do
    grep -q first-exit "$CT_DIR/$s.log" && grep -q first-exit "$CT_DIR/$c.log" && break
    sleep 0.05
  done
  { grep -q first-exit "$CT_DIR/$c.log" && grep -q first-exit "$CT_DIR/$s.log"; } ||
    fail "rolling: QPs hang after the router stopped" "$CT_DIR/$s.log" "$CT_DIR/$c.log"
  # shellcheck disable=SC2034  # read by the caller, as E2E_BACK_MS
  E2E_FAIL_MS=$((($(date +%s%N) - t0) / 1000000))
  grep -q 'first-exit=0' "$CT_DIR/$c.log" "$CT_DIR/$s.log" &&
    fail "rolling: a pingpong succeeded without its router" "$CT_DIR/$s.log" "$CT_DIR/$c.log"
  t0=$(date +%s%N)
  ROUTER_CT=router
  e2e_daemonset router freeflow-router "freeflow-router:$TAG" 0 "$CT_DIR/manifest.yaml"
  wait_for 10 test -S "$(node_root 0)/freeflow/ffrouter.sock" || fail "no new router" "$CT_DIR/router.log"
  # shellcheck disable=SC2034  # read by the caller
  E2E_BACK_MS=$((($(date +%s%N) - t0) / 1000000))
  [[ $(ct_wait "$c" 30) == 0 && $(ct_wait "$s" 10) == 0 ]] ||
    fail "rolling: new QPs in the same containers" "$CT_DIR/$s.log" "$CT_DIR/$c.log" "$CT_DIR/router.log"
  grep -q '1000 iters' "$CT_DIR/$c.log" || fail "rolling: second pingpong" "$CT_DIR/$c.log"
  ct_rm "$s"
  ct_rm "$c"
}

# perftest_figures KEY RUNNER ARGS...: RUNS runs of ib_write_bw and ib_send_lat, each
# figure appended to FIG[KEY_bw] and FIG[KEY_lat]; RUNNER is app_perftest (ARGS: server,
# client, server address) or measure.sh's perftest_run (ARGS: the two pods).
perftest_figures() {
  local key=$1 r
  shift
  for ((r = 0; r < RUNS; r++)); do
    FIG[${key}_bw]+=" $("$@" bw ib_write_bw -s 65536 -n 5000)"
    FIG[${key}_lat]+=" $("$@" typical ib_send_lat -s 2 -n 5000)"
  done
}

# figures one|two: the perftest figures of one node or two, containers beside namespaces.
figures() {
  local f k
  printf '   %-40s %-26s %s\n' "$1 node(s), median (min..max)" "containers" "namespaces"
  for f in bw:"ib_write_bw 64 KiB [Gbit/s]" lat:"ib_send_lat 2 B typical [us]"; do
    k=${f%%:*}
    # shellcheck disable=SC2086
    printf '   %-40s %-26s %s\n' "${f#*:}" "$(fmt_stats "$(stats ${FIG[$1_ct_$k]})")" \
      "$(fmt_stats "$(stats ${FIG[$1_ns_$k]})")"
  done
}

# two_nodes_up N M: nodes N and M joined by an underlay, the cluster's certificates (CA,
# node<N>, node<M>: scripts/ff-certs.sh, in $CT_DIR/pki) and one pod on each node (its
# address in CT_POD_IP<N>).
two_nodes_up() {
  local n
  for n in "$@"; do
    ct_node_up "$n"
    mkdir -p "$(node_root "$n")"
  done
  ct_nodes_link "$@"
  bash "$SRC/scripts/ff-certs.sh" "$CT_DIR/pki" ca >/dev/null
  bash "$SRC/scripts/ff-certs.sh" "$CT_DIR/pki" node "node$1" "node$2" >/dev/null
  for n in "$@"; do
    ct_pod_net "$n" 0
    printf -v "CT_POD_IP$n" '%s' "$CT_POD_IP"
  done
}

# two_routers OVERLAY N M [cluster_admin.py options...]: the router containers of nodes N
# and M from deploy/overlays/OVERLAY, after the admin's edits (cluster_admin.py: the
# options, and Secret freeflow-node-tls), waited for.
two_routers() {
  local overlay=$1 n m=$3
  shift
  kubectl kustomize "$SRC/deploy/overlays/$overlay" >"$CT_DIR/$overlay-built.yaml" 2>/dev/null
  python3 "$SRC/tests/e2e/cluster_admin.py" "$CT_DIR/$overlay-built.yaml" "$CT_DIR/pki" \
    "node$1,node$m" "${@:3}" >"$CT_DIR/$overlay.yaml" || fail "cluster_admin"
  for n in "$1" "$m"; do
    e2e_daemonset "router$n" freeflow-router "freeflow-router:$TAG" "$n" "$CT_DIR/$overlay.yaml"
  done
  for n in "$1" "$m"; do
    wait_for 10 test -S "$(node_root "$n")/freeflow/ffrouter.sock" ||
      fail "no router on node $n" "$CT_DIR/router$n.log"
  done
}

# two_routers_down N...: stops the routers of nodes N... as kubelet does (SIGTERM, then
# their grace period) and removes their containers.
two_routers_down() {
  local n
  for n in "$@"; do ct task kill -s TERM "router$n" 2>/dev/null || true; done
  for n in "$@"; do
    [[ $(ct_wait "router$n" 10) != 124 ]] || fail "router$n did not stop"
    ct_rm "router$n"
  done
}

# two_nodes_etcd N M: etcd in the underlay (https only, client certificates, etcd's
# authentication on, each node's user confined to its keys: scripts/ff-etcd-auth.sh); its
# client URL in CT_ETCD_URL.
two_nodes_etcd() {
  local u="ffe${CT_TAG}u" pki=$CT_DIR/pki ip="172.31.$CT_NET.2" i
  CT_ETCD_URL=https://$ip:2379
  bash "$SRC/scripts/ff-certs.sh" -i "$ip" "$pki" node etcd >/dev/null
  bash "$SRC/scripts/ff-certs.sh" "$pki" node root >/dev/null
  ip -n "$u" link set lo up
  ip -n "$u" addr add "$ip/24" dev ffu
  ip netns exec "$u" etcd --name ff --data-dir "$CT_DIR/etcd" \
    --listen-client-urls "$CT_ETCD_URL" --advertise-client-urls "$CT_ETCD_URL" \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster ff=http://127.0.0.1:2380 --cert-file "$pki/etcd.crt" --key-file "$pki/etcd.key" \
    --trusted-ca-file "$pki/ca.crt" --client-cert-auth >"$CT_DIR/etcd.log" 2>&1 &
  CT_PIDS+=("$!")
  for ((i = 0; i < 100; i++)); do
    ip netns exec "$u" curl -sf --cacert "$pki/ca.crt" --cert "$pki/root.crt" --key "$pki/root.key" \
      "$CT_ETCD_URL/health" >/dev/null 2>&1 && break
    sleep 0.1
  done
  local env=(ETCDCTL_API=3 "ETCDCTL_ENDPOINTS=$CT_ETCD_URL" "ETCDCTL_CACERT=$pki/ca.crt"
    "ETCDCTL_CERT=$pki/root.crt" "ETCDCTL_KEY=$pki/root.key")
  { ip netns exec "$u" env "${env[@]}" bash "$SRC/scripts/ff-etcd-auth.sh" enable >/dev/null &&
    ip netns exec "$u" env "${env[@]}" bash "$SRC/scripts/ff-etcd-auth.sh" node "node$1" "node$2" \
      >/dev/null; } || fail "etcd with authentication" "$CT_DIR/etcd.log"
}

# app_rping SERVER CLIENT SERVER_IP: rping (rdma_cm, the router answering for
# /dev/infiniband/rdma_cm) between two app containers, 100 pings verified (-V); the client
# tries again until the server listens (at most 10 s). Logs: $CT_DIR/rping-c.log.
app_rping() {
  local s c
  s=$(app_id rping-s)
  c=$(app_id rping-c)
  app_run "$s" "$1" rping -s -a 0.0.0.0 -p 7174 -C 100 -V
  # shellcheck disable=SC2016  # the container's shell expands it
  app_run "$c" "$2" sh -c 'i=0; until rping -c -a "$1" -p 7174 -C 100 -v -V; do
    i=$((i + 1)); [ $i -gt 40 ] && exit 1; sleep 0.25; done' rping "$3"
  local crc src
  crc=$(ct_wait "$c" 30)
  src=$(ct_wait "$s" 10)
  { cat "$CT_DIR/$c.log"; echo "(client exit $crc)"; } >"$CT_DIR/rping-c.log"
  { cat "$CT_DIR/$s.log"; echo "(server exit $src)"; } >"$CT_DIR/rping-s.log"
  ct_rm "$s"
  ct_rm "$c"
  [[ $crc == 0 && $src == 0 ]] && grep -q '^ping data: rdma-ping-99: ' "$CT_DIR/rping-c.log"
}

# least_privilege NODE: the router's privileges in deploy/ are each needed: the router of
# DaemonSet freeflow-router started on node NODE without one of them (host PIDs,
# SYS_ADMIN, SYS_PTRACE) refuses a pod's process with the reason the kernel gives it.
least_privilege() {
  local node=$1 what drop want spec id app i all=() args=()
  ct_node_up "$node"
  mkdir -p "$(node_root "$node")"
  ip -n "$(ct_node_ns "$node")" addr add "$(ct_node_ip "$node")/32" dev lo
  ct_pod_net "$node" 0
  for what in "pid:not visible in the router's pid namespace" \
    "CAP_SYS_ADMIN:cannot enter the client's network namespace" \
    "CAP_SYS_PTRACE:cannot enter the client's network namespace"; do
    drop=${what%%:*}
    want=${what#*:}
    spec=$(python3 "$SRC/tests/e2e/kubelet_spec.py" daemonset "$CT_DIR/manifest.yaml" freeflow-router \
      "$(node_root "$node")" "node$node" "$(ct_node_ip "$node")" "/run/netns/$(ct_node_ns "$node")" \
      "/proc/$$/ns/pid") || fail "cannot translate DaemonSet freeflow-router"
    mapfile -t all <<<"$spec"
    args=()
    for ((i = 0; i < ${#all[@]}; i++)); do  # the spec less one option and its value
      if [[ ${all[i]} == --with-ns || ${all[i]} == --cap-add ]] &&
        [[ ${all[i + 1]} == "$drop" || ($drop == pid && ${all[i + 1]} == pid:*) ]]; then
        i=$((i + 1))
        continue
      fi
      args+=("${all[i]}")
    done
    id=lp-$drop
    ct_run "$id" "freeflow-router:$TAG" "${args[@]}" || fail "cannot start $id"
    wait_for 10 test -S "$(node_root "$node")/freeflow/ffrouter.sock" || fail "$id does not serve" "$CT_DIR/$id.log"
    app=$(app_id lp-app)
    app_run "$app" "$node:0" ibv_devices
    ct_wait "$app" 20 >/dev/null  # ibv_devices lists no device (and exits 0)
    { ! grep -q freeflow0 "$CT_DIR/$app.log" && grep -qF "$want" "$CT_DIR/$app.log"; } ||
      fail "a router without $drop still identifies pods" "$CT_DIR/$app.log" "$CT_DIR/$id.log"
    ok "without $([[ $drop == pid ]] && echo hostPID || echo "${drop#CAP_}"): refused, \"$want\""
    ct task kill -s TERM "$id"
    [[ $(ct_wait "$id" 10) != 124 ]] || fail "$id did not stop"
    ct_rm "$id"
    ct_rm "$app"
  done
}

# router_probe KIND [CONTAINER]: runs the router DaemonSet's exec probe KIND (startupProbe,
# readinessProbe, livenessProbe) in the router container (ROUTER_CT unless named), exactly as
# the manifest writes it; its status.
router_probe() {
  local -a cmd
  mapfile -t cmd < <(python3 "$SRC/tests/e2e/kubelet_spec.py" probe "$CT_DIR/manifest.yaml" \
    freeflow-router "$1")
  [[ ${#cmd[@]} -gt 0 ]] || return 2
  ct task exec --fifo-dir "$CT_DIR/fifo" --exec-id "probe-$1-$RANDOM" "${2:-$ROUTER_CT}" "${cmd[@]}" >/dev/null 2>&1
}

# router_liveness: the liveness probe passes while the router's loop turns, fails once it
# router_metrics NODE: scrapes the router of node NODE as Prometheus would, at the node's
# address and the port its DaemonSet names (FREEFLOW_METRICS_ADDRESS, docs/metrics.md),
# checks the text with promtool and sets E2E_METRICS to a few of its figures.
router_metrics() {
  local node=$1 out="$CT_DIR/metrics-$1.txt" port
  port=$(grep -oE 'prometheus.io/port: "?94[0-9]+' "$CT_DIR/manifest.yaml" | head -n 1 | grep -oE '[0-9]+$')
  [[ $port == 9478 ]] || fail "the router DaemonSet names no metrics port 9478 ($port)"
  ip netns exec "$(ct_node_ns "$node")" curl -sf --max-time 5 \
    "http://$(ct_node_ip "$node"):$port/metrics" >"$out" || fail "no /metrics on node $node" "$CT_DIR/router.log"
  promtool check metrics <"$out" >"$CT_DIR/promtool.log" 2>&1 ||
    fail "promtool rejects the router's metrics" "$CT_DIR/promtool.log"
  grep -q '^freeflow_router_build_info{' "$out" || fail "no build info in the router's metrics" "$out"
  figure() { awk -v n="$1" '$1 == n {print $2}' "$out"; }
  E2E_METRICS="sessions $(figure freeflow_router_sessions), qps $(figure freeflow_router_qps), loop turns"
  E2E_METRICS+=" $(figure freeflow_router_loop_turn_seconds_count), fds $(figure process_open_fds)"
}

# operations NODE PLACEMENT KIND [PEER_NODE]: the work requests of KIND at PLACEMENT (to
# PEER_NODE, else any) that node NODE's last scrape (router_metrics) counts, summed.
operations() {
  awk -v p="$2" -v k="$3" -v n="${4:-}" '
    $1 ~ /^freeflow_router_operations_total\{/ && index($1, "placement=\"" p "\"") &&
      index($1, "kind=\"" k "\"") && (n == "" || index($1, "peer_node=\"" n "\"")) { s += $2 }
    END { print s + 0 }' "$CT_DIR/metrics-$1.txt"
}

# ffctl_in CONTAINER ARGS...: ffctl in a router container, as `kubectl exec` runs it.
ffctl_in() {
  local c=$1
  shift
  ct task exec --fifo-dir "$CT_DIR/fifo" --exec-id "ffctl-$RANDOM" "$c" /usr/local/bin/ffctl "$@"
}

# has been stuck for 10 s (the router frozen with SIGSTOP, as a hung loop would be), and
# passes again soon after it runs again. A probe that only checks the socket would pass all
# along.
router_liveness() {
  router_probe livenessProbe || fail "the router's liveness probe fails on a working router" "$CT_DIR/router.log"
  local pid t0
  pid=$(ct_pid router)
  [[ -n $pid ]] || fail "no router task"
  t0=$(date +%s)
  kill -STOP "$pid"
  if ! wait_for 20 eval '! router_probe livenessProbe'; then
    kill -CONT "$pid"
    fail "the liveness probe still passes with the router stopped for 20 s"
  fi
  local stuck=$(($(date +%s) - t0))
  kill -CONT "$pid"
  wait_for 5 router_probe livenessProbe || fail "the liveness probe fails after the router resumed" "$CT_DIR/router.log"
  ok "liveness probe: passes, fails ${stuck} s after the router's loop stopped (SIGSTOP), passes again after SIGCONT"
}
