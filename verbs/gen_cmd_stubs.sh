#!/usr/bin/env bash
# Regenerates src/control/cmd_stubs.cc from the symbols the installed libibverbs exports.
set -euo pipefail
cd "$(dirname "$0")"
lib=${1:-/usr/lib/x86_64-linux-gnu/libibverbs.so.1}
{
  echo '// Generated list of the kernel-command helpers libibverbs exports for providers; a'
  echo '// virtual device has no kernel command channel, so each answers EOPNOTSUPP.'
  echo '// Regenerate with verbs/gen_cmd_stubs.sh when libibverbs adds one.'
  echo '#include <cerrno>'
  echo '#define FFV_CMD_STUB(name) extern "C" __attribute__((visibility("default"))) int name() { return EOPNOTSUPP; }'
  objdump -T "$lib" | awk '/DF \.text/ {print $NF}' | grep '^ibv_cmd_' | sort -u | sed 's/.*/FFV_CMD_STUB(&)/'
} > src/control/cmd_stubs.cc
