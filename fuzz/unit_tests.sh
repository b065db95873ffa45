#!/usr/bin/env bash
# The unit tests of core, the router, the library, the cluster and libfsocket, built in the
# fuzz build (every library and test with ASan and UBSan, fuzz/README.md) and run there with
# ctest: a sanitizer report (memory error, leak, undefined behaviour) fails its test.
#
#   fuzz/unit_tests.sh [-b BUILD_DIR] [-j JOBS]
#
# BUILD_DIR (default build-fuzz) is the fuzz build fuzz/run.sh uses; JOBS (default: the
# processors) compile jobs and tests at a time (tests marked RUN_SERIAL run alone). To run
# some again: the settings below, then ctest -R in BUILD_DIR.
set -euo pipefail

src=$(cd "$(dirname "$0")/.." && pwd)
build="build-fuzz"
jobs=$(nproc)
while getopts "b:j:" opt; do
  case $opt in
    b) build=$OPTARG ;;
    j) jobs=$OPTARG ;;
    *) echo "usage: $0 [-b BUILD_DIR] [-j JOBS]" >&2; exit 2 ;;
  esac
done

mkdir -p "$build"
build=$(cd "$build" && pwd)
started=$SECONDS
bash "$src/fuzz/build.sh" "$build" "$jobs" core_unit_tests router_unit_tests verbs_unit_tests \
  cm_librdmacm_tests device_reopen_tests cluster_unit_tests fsocket_unit_tests core_seal_tests direct_unit_tests
echo "sanitized unit tests built in $((SECONDS - started)) s"

# The fuzz runs' settings (fuzz/run.sh), leaks included: every report is fatal, but for those
# fuzz/ubsan.supp and fuzz/lsan.supp silence, which are not findings.
export ASAN_OPTIONS=detect_leaks=1
export LSAN_OPTIONS=suppressions=$src/fuzz/lsan.supp
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:suppressions=$src/fuzz/ubsan.supp
# Two tests cannot run under the sanitizers; they run in every other build:
# - PodQuotaTest.ARouterOutOfDescriptors... leaves its router no descriptor on purpose, and
#   UBSan needs one to check a virtual call (it probes memory through a pipe): each call
#   then reports an invalid vptr, which the symbolizer (started over a socketpair) cannot
#   even name;
# - RestrictedTest confines a child to a few system calls with seccomp, and ASan's code
#   before a call that does not return (_exit) makes another (sigaltstack).
# And two that measure the scheduler (a waiter that must take an event without sleeping, a
# poller that must leave its CPU to a busy thread) within microseconds, which ASan's
# slower code does not keep.
skip='^unit\.router\.PodQuotaTest\.ARouterOutOfDescriptors|^unit\.fsocket\.RestrictedTest\.'
skip+='|^unit\.verbs\.Events\.ABlockingWaitTakesAnEventThatFiresSoonWithoutSleeping$'
skip+='|^unit\.verbs\.PollSleep\.ASpinningPollerLetsABusyThreadOnItsCpuRun$'
cd "$build"
status=0
# What each failed test said, again at the end (tests/failure_digest.py).
digest() { python3 "$src/tests/failure_digest.py" Testing/Temporary/LastTest.log >>Testing/failed.txt; }
rm -f Testing/failed.txt
ctest --output-on-failure -j "$jobs" -L unit -E "$skip|^unit\.fsocket\." || { status=1; digest; }
# libfsocket lets a wait go on after a signal only when every handler has SA_RESTART
# (fsocket/src/stream.cc); ASan's handlers of SIGSEGV, SIGBUS and SIGFPE have not, so its
# tests run without them (a crash there is still a failure, only without ASan's report).
ASAN_OPTIONS=$ASAN_OPTIONS:handle_segv=0:handle_sigbus=0:handle_sigfpe=0 \
  ctest --output-on-failure -j "$jobs" -L unit -R '^unit\.fsocket\.' -E "$skip" || { status=1; digest; }
if ((status != 0)); then
  echo "What the failed sanitized tests said:"
  cat Testing/failed.txt
fi
exit $status
