#!/usr/bin/env bash
# The size limits the code keeps (outside tests and generated code): no source file over
# 800 lines, no function over 100 lines; and no folder of source, tests included, holds more
# than 24 files, so that each folder stays one room a reader takes in at once. Function sizes come from clang-tidy's
# readability-function-size over the build's compile_commands.json.
#   tests/style/limits.sh SOURCE_DIR BUILD_DIR
set -uo pipefail
src=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
max_file=800
max_function=100
max_folder=24
status=0

cd "$src" || exit 1
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  files=$(git ls-files '*.cc' '*.h')
else
  files=$(find . -path ./build -prune -o \( -name '*.cc' -o -name '*.h' \) -print | sed 's|^\./||')
fi
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  sources=$(git ls-files '*.cc' '*.h' '*.c' '*.sh' '*.py')
else
  sources=$files
fi
crowded=$(xargs -n1 dirname <<<"$sources" | sort | uniq -c | awk -v max=$max_folder '$1 > max {print $2 ": " $1 " files"}')
if [[ -n "$crowded" ]]; then
  echo "FAIL folders of source over $max_folder files:"
  echo "$crowded"
  status=1
fi
files=$(grep -v -E '^(tests|build[^/]*)/' <<<"$files")
long=$(for f in $files; do n=$(wc -l <"$f"); ((n > max_file)) && echo "$f: $n lines"; done)
if [[ -n "$long" ]]; then
  echo "FAIL files over $max_file lines:"
  echo "$long"
  status=1
fi

# Every translation unit of ours that the build compiles, outside tests and generated code.
units=$(python3 - "$build/compile_commands.json" "$src" <<'PY'
import json, os, sys
src = sys.argv[2]
for e in json.load(open(sys.argv[1])):
    f = os.path.realpath(os.path.join(e["directory"], e["file"]))
    rel = os.path.relpath(f, src)
    if rel.startswith("..") or rel.startswith("tests/") or rel.startswith("build"):
        continue
    print(f)
PY
)
if ! command -v clang-tidy >/dev/null || [[ $(wc -w <<<"$units") -lt 10 ]]; then
  echo "FAIL cannot check function sizes: no clang-tidy, or no compile_commands.json in $build"
  exit 1
fi
config="{CheckOptions: [{key: readability-function-size.LineThreshold, value: $max_function}]}"
report=$(printf '%s\n' "$units" | sort -u |
  xargs -P "$(nproc)" -n 4 clang-tidy -p "$build" --quiet --checks='-*,readability-function-size' \
    --config="$config" --header-filter="^$src/(core|router|verbs|controlplane|device-plugin)/" 2>/dev/null |
  grep -E 'warning: function .* exceeds' | sort -u)
if [[ -n "$report" ]]; then
  echo "FAIL functions over $max_function lines:"
  echo "$report"
  status=1
fi
echo "$(wc -w <<<"$files") source files checked, $(wc -w <<<"$units") translation units"
exit $status
