#!/usr/bin/env bash
# Every shell script of the tree, checked with shellcheck: the *.sh files, and the files
# without an extension whose first line runs bash or sh. Settings are in .shellcheckrc
# (sourced files are followed from each script's folder). A finding that is meant stays,
# with `# shellcheck disable=SCnnnn` and its reason on the line before it.
#   tests/style/shellcheck.sh SOURCE_DIR
set -uo pipefail
cd "$1" || exit 1

if ! command -v shellcheck >/dev/null; then
  echo "FAIL cannot check shell scripts: no shellcheck (scripts/install-deps.sh installs it)"
  exit 1
fi
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  # Files not yet added count too, so that a new script is checked before its commit.
  mapfile -t files < <(git ls-files --cached --others --exclude-standard | sort -u)
else
  mapfile -t files < <(find . -path './build*' -prune -o -type f -print | sed 's|^\./||' | sort)
fi

scripts=()
for f in "${files[@]}"; do
  [[ -f $f ]] || continue  # deleted in the work tree, not yet in the index
  name=${f##*/}
  if [[ $name == *.sh ]]; then
    scripts+=("$f")
  elif [[ $name != *.* ]] && head -n 1 "$f" | grep -qE '^#!.*[/ ](ba)?sh( |$)'; then
    scripts+=("$f")
  fi
done
if ((${#scripts[@]} < 10)); then
  echo "FAIL found ${#scripts[@]} shell scripts under $1; expected the tree's"
  exit 1
fi

# A few scripts a process: each follows what it sources, which costs more than the check.
if ! printf '%s\0' "${scripts[@]}" | xargs -0 -P "$(nproc)" -n 4 shellcheck --format=gcc; then
  echo "FAIL shellcheck findings above (fix them, or disable one with its reason)"
  exit 1
fi
echo "PASS ${#scripts[@]} shell scripts, no shellcheck finding"
