#!/usr/bin/env bash
# A diagnostic, not a test (ctest does not run it): the UD churn case of ucx.sh (20 MPI ranks
# over ud_verbs, alltoall pairwise, two pods on two nodes: more senders than a UD QP has
# rings, more links than a pod's quota) ROUNDS times on one cluster, with the routers' extra
# arguments ROUTER_ARGS (for example --direct-datagrams). It prints each round's outcome and
# time. A round still running after STALL_S seconds is sampled once, into KEEP/ROUND/:
# every rank's threads with the CPU each used over a second, state, wait channel, system
# call and kernel stack (kernel.txt, read from /proc: nobody is stopped), ps's view of the
# ranks (ps.txt), both routers' last periodic stats lines (up to a stats period old), every
# rank's Unix sockets that hold queued data (read in its pod's network namespace) and the
# direct connections' TCP queues; with STACKS=1 also the stacks of the ranks whose event
# socket (the library's SEQPACKET socket to its router) holds events it has not taken. Every
# round's mpi.log goes there too (a slow round that passed says as much as one that failed).
#
#   FF_BUILD=build FF_UCX_MPI=build/tests/integration/ucx/ucx_mpi_check \
#     ROUNDS=12 ROUTER_ARGS=--direct-datagrams bash tests/integration/ucx/ud_churn.sh
#
# The stacks disturb the round they sample: eu-stack stops a rank (ptrace) while it unwinds
# it (0.04-1.1 s each here, with 20 ranks on two vCPUs), one rank after another, and the
# alltoall's peers wait for each. What follows such a sample is not evidence of the stall
# that led to it. STALL_S=1000 turns sampling off.
# Needs eu-stack (elfutils) for STACKS=1.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/../../../scripts/lib/cluster.sh"
MPI_PROG=${FF_UCX_MPI:?FF_UCX_MPI: the ucx_mpi_check program of the build}
ROUNDS=${ROUNDS:-10}
STALL_S=${STALL_S:-16}
KEEP=${KEEP:-/tmp/ud-churn}
read -ra router_args <<<"${ROUTER_ARGS:-}"
trap multinode_down EXIT

# ranks: the PIDs of the MPI ranks now (by their program: a rank stuck in the kernel may not
# show its name to ps).
ranks() {
  local p
  for p in /proc/[0-9]*; do
    [[ $(readlink "$p/exe" 2>/dev/null) == */ucx_mpi_check ]] && echo "${p#/proc/}"
  done
  return 0
}

# cpu_of PID: "TID utime+stime STATE" (clock ticks, one letter) for each thread of PID.
cpu_of() {
  local t
  for t in /proc/"$1"/task/*; do
    awk -v t="${t##*/}" '{sub(/^.*\) /, ""); print t, $12 + $13, $1}' "$t/stat" 2>/dev/null
  done
}

# kernel_state: for every rank, each thread's CPU time over one second (a thread that used
# none while its rank stalls is not polling), its state, wait channel, system call and
# kernel stack, read from /proc without stopping anyone.
kernel_state() {
  local p t c after state
  local -A before
  for p in $(ranks); do
    while read -r t c _; do before[$t]=$c; done < <(cpu_of "$p")
  done
  sleep 1
  for p in $(ranks); do
    echo "=== rank $p"
    while read -r t after state; do
      echo "--- thread $t $(cat /proc/"$p"/task/"$t"/comm 2>/dev/null):" \
        "cpu ticks in 1 s $((after - ${before[$t]:-0})), state $state," \
        "wchan $(cat /proc/"$p"/task/"$t"/wchan 2>/dev/null)," \
        "syscall $(cut -d' ' -f1 /proc/"$p"/task/"$t"/syscall 2>/dev/null)"
      cat /proc/"$p"/task/"$t"/stack 2>/dev/null
    done < <(cpu_of "$p")
  done
}

# sample DIR: what a stalled round looks like (see the header).
sample() {
  local dir=$1 n p queued
  timeout 5 ps -eo pid,stat,wchan:32,comm,args | grep '[u]cx_mpi_check' >"$dir/ps.txt"
  kernel_state >"$dir/kernel.txt"
  for n in 0 1; do
    echo "router $n: $(router_stats_line "${FF_NODE_ROUTER[$n]}" "$(mn_dir "$n")/router.log")"
  done >"$dir/routers.txt"
  for p in $(ranks); do
    queued=$(nsenter -t "$p" -n ss -xpn 2>/dev/null | grep "pid=$p," | awk '$3 > 0 || $4 > 0')
    echo "=== rank $p"
    [[ -n $queued ]] && echo "$queued"
    if [[ ${STACKS:-0} == 1 ]] && grep -q '^u_seq ESTAB [1-9]' <<<"$queued" &&
      command -v eu-stack >/dev/null; then
      echo "--- events not taken: stacks"
      timeout 10 eu-stack -p "$p" 2>&1
    fi
  done >"$dir/sockets.txt"
  # Direct connections (TCP between ranks of the two pods) with bytes queued either way: a
  # reader that stopped reading shows here.
  for p in $(ranks); do
    echo "=== rank $p"
    nsenter -t "$p" -n ss -tnpi 2>/dev/null |
      awk -v me="pid=$p," '/^[A-Z]/ {keep = ($2 > 0 || $3 > 0) && index($0, me); if (keep) print; next}
        keep {print}'
  done >"$dir/tcp.txt"
}

# round N: one MPI run; 0 when every rank reported.
round() {
  local dir="$KEEP/$1" a b pid w st
  mkdir -p "$dir"
  a=$(mn_pod_ip 0 0) b=$(mn_pod_ip 1 0)
  printf '%s %s %s\n' "$a" "$(mn_pod_ns 0 0)" "$(mn_dir 0)" "$b" "$(mn_pod_ns 1 0)" "$(mn_dir 1)" \
    >"$FF_DIR/mpi-pods"
  mn_pod_run 0 0 env FF_MPI_PODS="$FF_DIR/mpi-pods" ${FFV_LOG:+FFV_LOG=$FFV_LOG} UCX_TLS=ud_v,self UCX_NET_DEVICES=freeflow0:1 \
    timeout 120 mpirun --allow-run-as-root -np 20 --host "$a:10,$b:10" --oversubscribe \
    --mca mpi_yield_when_idle 1 --mca plm_rsh_agent "$HERE/ucx_rsh_agent.sh" --mca pml ucx \
    --mca btl self --mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_alltoall_algorithm 2 \
    -x UCX_TLS -x UCX_NET_DEVICES ${FFV_LOG:+-x FFV_LOG} "$MPI_PROG" >"$FF_DIR/mpi.log" 2>&1 &
  pid=$!
  for ((w = 0; w < STALL_S; w++)); do
    sleep 1
    kill -0 "$pid" 2>/dev/null || break
  done
  kill -0 "$pid" 2>/dev/null && sample "$dir"
  wait "$pid"
  st=$?
  cp "$FF_DIR/mpi.log" "$dir/"
  [[ $st -eq 0 && $(grep -c '^ucx_mpi_check ok rank' "$FF_DIR/mpi.log") -eq 20 ]]
}

multinode_up 2 2
mn_router_up 0 "${router_args[@]}" || exit 1
mn_router_up 1 "${router_args[@]}" || exit 1
failed=0
for ((r = 0; r < ROUNDS; r++)); do
  t0=$SECONDS
  if round "$r"; then
    echo "round $r: ok ($((SECONDS - t0)) s)"
  else
    echo "round $r: FAILED ($((SECONDS - t0)) s; $KEEP/$r)"
    failed=$((failed + 1))
  fi
done
cp "$(mn_dir 0)/router.log" "$KEEP/router0.log"
cp "$(mn_dir 1)/router.log" "$KEEP/router1.log"
echo "$failed of $ROUNDS rounds failed"
[[ $failed -eq 0 ]]
