#!/usr/bin/env bash
# Builds TARGETs in the fuzz build (fuzz/README.md), configuring BUILD_DIR with clang and
# FREEFLOW_FUZZ=ON when it has no cache yet. fuzz/run.sh (the fuzz targets) and
# fuzz/unit_tests.sh (the sanitized unit tests) share it, and so the objects of one build.
#   fuzz/build.sh BUILD_DIR JOBS TARGET...
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=$1 jobs=$2
shift 2
if [[ ! -f $build/CMakeCache.txt ]]; then
  launcher=()
  if command -v ccache >/dev/null; then
    launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
  fi
  # -O1 and line tables only: libFuzzer's usual choice, and a build CI can afford.
  cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Fuzz -DFREEFLOW_FUZZ=ON \
    -DCMAKE_CXX_FLAGS_FUZZ="-O1 -gline-tables-only" -DCMAKE_C_FLAGS_FUZZ="-O1 -gline-tables-only" \
    -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang "${launcher[@]}" >/dev/null
fi
cmake --build "$build" -j "$jobs" --target "$@" >/dev/null
