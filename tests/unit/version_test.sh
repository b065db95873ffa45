#!/usr/bin/env bash
# Unit: PROGRAM --version prints one line, "NAME VERSION (commit COMMIT)", and exits 0 without
# its other flags: VERSION is the project's (CMake's PROJECT_VERSION), COMMIT a short git
# hash, with "-dirty" when the tree had changes at build time, or "unknown" outside git.
#   tests/unit/version_test.sh PROGRAM NAME VERSION
set -uo pipefail
program=$1 name=$2 version=$3
out=$("$program" --version 2>&1)
rc=$?
lines=$(wc -l <<<"$out")
pattern="^$name ${version//./\\.} \\(commit ([0-9a-f]{7,40}(-dirty)?|unknown)\\)\$"
if [[ $rc -eq 0 && $lines -eq 1 && $out =~ $pattern ]]; then
  echo "PASS $out"
else
  echo "FAIL $name --version (exit $rc, $lines lines; want /$pattern/): $out"
  exit 1
fi
