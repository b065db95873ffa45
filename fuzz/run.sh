#!/usr/bin/env bash
# Builds the libFuzzer targets in their own clang build and runs each for a bounded time.
#
#   fuzz/run.sh [-b BUILD_DIR] [-t SECONDS] [-n RUNS] [-L] [-f WORKERS] [-j JOBS] [-p PARALLEL] [TARGET...]
#
# BUILD_DIR (default build-fuzz) is configured with clang and FREEFLOW_FUZZ=ON when it has no
# cache yet. Each target runs SECONDS (default 300), or with -n until it executed RUNS inputs
# (the long runs: -n 10000000), on its corpus, BUILD_DIR/corpus/TARGET,
# seeded from fuzz/corpus/TARGET; PARALLEL targets run at a time (default 1). Crash inputs
# and logs go to BUILD_DIR/findings/TARGET. Exits non-zero when any target found a crash,
# a leak, a timeout or a sanitizer report, or did not run. -L turns leak detection off: in the
# router targets libFuzzer looks for leaks after every input whose mallocs and frees differ,
# which the router's own thread makes most of them, and that halves their speed. -f runs
# each target as one campaign of WORKERS processes (libFuzzer's -fork), one per core.
set -euo pipefail

src=$(cd "$(dirname "$0")/.." && pwd)
build="build-fuzz"
seconds=300
jobs=2
parallel=1
runs=-1
leaks=1
fork=()
while getopts "b:t:n:Lf:j:p:" opt; do
  case $opt in
    b) build=$OPTARG ;;
    t) seconds=$OPTARG ;;
    n) runs=$OPTARG seconds=0 ;;
    L) leaks=0 ;;
    f) fork=(-fork="$OPTARG") ;;
    j) jobs=$OPTARG ;;
    p) parallel=$OPTARG ;;
    *) echo "usage: $0 [-b BUILD_DIR] [-t SECONDS] [-n RUNS] [-L] [-f WORKERS] [-j JOBS] [-p PARALLEL] [TARGET...]" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
targets=("$@")
# Heavy targets (a router thread each) alternate with light ones when run two at a time.
((${#targets[@]})) || targets=(pod_messages controlplane_file node_frames ring_records direct_frames)

mkdir -p "$build"
build=$(cd "$build" && pwd)
bash "$src/fuzz/build.sh" "$build" "$jobs" "${targets[@]/#/fuzz_}"

# Longest input each target reads (bytes) and the slowest one run it may take (s).
declare -A max_len=([pod_messages]=4096 [node_frames]=16384 [ring_records]=8192
                    [controlplane_file]=4096 [direct_frames]=131072)
# The library logs every corrupt ring it meets to stderr: ring_records runs with the target's
# stderr closed (libFuzzer and the sanitizers keep reporting on their own copy of it).
declare -A quiet=([ring_records]=-close_fd_mask=2)
export ASAN_OPTIONS=detect_leaks=$leaks:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:suppressions=$src/fuzz/ubsan.supp

run_one() {
  local t=$1
  local corpus=$build/corpus/$t findings=$build/findings/$t
  mkdir -p "$corpus" "$findings"
  if [[ -d $src/fuzz/corpus/$t ]]; then cp -n "$src/fuzz/corpus/$t"/* "$corpus"/ 2>/dev/null || true; fi
  local log=$findings/run.log
  local rc=0 started=$SECONDS
  (cd "$findings" && "$build/fuzz/fuzz_$t" -max_total_time="$seconds" -runs="$runs" "${fork[@]}" -timeout=20 \
     -rss_limit_mb=4096 -max_len="${max_len[$t]:-4096}" -print_final_stats=1 ${quiet[$t]:+"${quiet[$t]}"} \
     -artifact_prefix="$findings/" "$corpus") >"$log" 2>&1 || rc=$?
  local done_runs
  done_runs=$(sed -n -e 's/^stat::number_of_executed_units: *//p' \
    -e 's/^INFO: fuzzed for \([0-9]*\) iterations.*/\1/p' "$log" | tail -1)  # fork: the latter
  if ((rc != 0)) || [[ -z $done_runs ]]; then
    echo "fuzz $t: FAILED (exit $rc) after ${done_runs:-?} runs; see $log" >&2
    grep -E "^==[0-9]+==ERROR|SUMMARY|^artifact_prefix|Test unit written" "$log" >&2 || true
    return 1
  fi
  # shellcheck disable=SC2012  # libFuzzer names corpus files by their hash
  echo "fuzz $t: ${done_runs} runs in $((SECONDS - started)) s, no crash (corpus $(ls "$corpus" | wc -l) inputs)"
}

failed=0
pids=()
for t in "${targets[@]}"; do
  run_one "$t" &
  pids+=($!)
  if ((${#pids[@]} >= parallel)); then
    wait "${pids[0]}" || failed=1
    pids=("${pids[@]:1}")
  fi
done
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
if ((failed)); then
  echo "fuzz: FAILED" >&2
  exit 1
fi
echo "fuzz: ${#targets[@]} passed, 0 failed"
