#!/usr/bin/env bash
# Turns on etcd's authentication for freeflow and confines each router to its own node's
# keys (issue 10; docs/control-plane.md, "Running etcd securely"):
#
#   ff-etcd-auth.sh [-p PREFIX] [-s] enable        root user and role; authentication on
#   ff-etcd-auth.sh [-p PREFIX] [-s] node NAME...  per node: a role and a user named NAME
#
# The role of node NAME, freeflow-node-NAME, may read every key under PREFIX (every router
# must see every node and pod) and write only under PREFIXnodes/NAME/, the keys of that
# node; the user NAME holds that role and no other. Without -s the users have no password:
# the root user and the routers authenticate with client certificates whose CN is the user
# name (etcd with --client-cert-auth; scripts/ff-certs.sh makes node certificates with
# CN = node name). With -s, passwords are read from standard input, one line per user, in
# the order of the command line (for enable: the root password); no whitespace in them.
#
# etcdctl reaches etcd as its environment says, with root's credentials once
# authentication is on: ETCDCTL_ENDPOINTS, ETCDCTL_CACERT, and ETCDCTL_CERT + ETCDCTL_KEY
# (a certificate with CN root) or ETCDCTL_USER=root:PASSWORD. Running it again changes
# nothing that is as it should be: a role with other permissions is made anew, roles a
# node's user should not hold are revoked, and with -s the passwords are set again (which
# also invalidates the tokens etcd gave these users). PREFIX defaults to /freeflow/v2/
# (the control plane's default) and must end with '/'.
set -euo pipefail

usage() {
  sed -n '5,6p' "$0" | sed 's/^# */usage: /' >&2
  exit 2
}
prefix=/freeflow/v2/ stdin_passwords=0
while (($# > 0)) && [[ $1 == -* ]]; do
  if [[ $1 == -s ]]; then
    stdin_passwords=1
    shift
  elif [[ $1 == -p && $# -ge 2 ]]; then
    prefix=$2
    shift 2
  else
    usage
  fi
done
(($# >= 1)) || usage
what=$1
shift
[[ $prefix == /*/ ]] || { echo "ff-etcd-auth: the prefix '$prefix' must start and end with '/'" >&2; exit 2; }
command -v etcdctl >/dev/null || { echo "ff-etcd-auth: etcdctl is missing (apt-get install etcd-client)" >&2; exit 1; }
export ETCDCTL_API=3

ctl() { etcdctl "$@"; }

# A node name as Kubernetes allows it (a DNS subdomain), as scripts/ff-certs.sh checks it.
valid_name() {
  [[ ${#1} -le 253 && $1 =~ ^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$ ]]
}

# next_password: the next line of standard input (with -s), checked.
next_password() {
  local pw
  IFS= read -r pw || { echo "ff-etcd-auth: -s: standard input has no password left" >&2; exit 2; }
  [[ -n $pw && ! $pw =~ [[:space:]] ]] || { echo "ff-etcd-auth: a password must be non-empty, without whitespace" >&2; exit 2; }
  printf '%s\n' "$pw"
}

# ensure_user NAME [PASSWORD]: the user exists; with a password, it is (set to) that one.
ensure_user() {
  local name=$1 pw=${2-}
  if ! ctl user get "$name" >/dev/null 2>&1; then
    if [[ -n $pw ]]; then
      printf '%s\n' "$pw" | ctl user add "$name" --interactive=false >/dev/null
    else
      ctl user add "$name" --no-password >/dev/null
    fi
    echo "ff-etcd-auth: user $name added"
  elif [[ -n $pw ]]; then
    printf '%s\n' "$pw" | ctl user passwd "$name" --interactive=false >/dev/null
    echo "ff-etcd-auth: user $name: password set"
  fi
}

# user_roles NAME: the roles NAME holds, one a line.
user_roles() {
  ctl user get "$1" | sed -n 's/^Roles: *//p' | tr ' ' '\n' | sed '/^$/d'
}

# The end of the key range of a prefix ending with '/': etcd's "prefix" ranges.
range_end() { printf '%s0' "${1%/}"; }

# What `etcdctl role get` prints for node NAME's role when it is exactly as it should be.
expected_role() {
  local name=$1 dir="${prefix}nodes/$1/"
  printf 'Role freeflow-node-%s\nKV Read:\n' "$name"
  printf '\t[%s, %s) (prefix %s)\n' "$prefix" "$(range_end "$prefix")" "$prefix"
  printf '\t[%s, %s) (prefix %s)\n' "$dir" "$(range_end "$dir")" "$dir"
  printf 'KV Write:\n\t[%s, %s) (prefix %s)\n' "$dir" "$(range_end "$dir")" "$dir"
}

make_node() {
  local name=$1 pw=${2-} role="freeflow-node-$1" dir="${prefix}nodes/$1/" r
  if [[ $(ctl role get "$role" 2>/dev/null || true) != "$(expected_role "$name")" ]]; then
    ctl role delete "$role" >/dev/null 2>&1 || true
    ctl role add "$role" >/dev/null
    ctl role grant-permission "$role" read "$prefix" --prefix >/dev/null
    ctl role grant-permission "$role" readwrite "$dir" --prefix >/dev/null
    echo "ff-etcd-auth: role $role: read $prefix, readwrite $dir"
  fi
  ensure_user "$name" "$pw"
  for r in $(user_roles "$name"); do
    [[ $r == "$role" ]] && continue
    ctl user revoke-role "$name" "$r" >/dev/null
    echo "ff-etcd-auth: user $name: role $r revoked"
  done
  if ! user_roles "$name" | grep -qxF "$role"; then
    ctl user grant-role "$name" "$role" >/dev/null
    echo "ff-etcd-auth: user $name: role $role granted"
  fi
}

enable() {
  local pw=
  ((stdin_passwords == 0)) || pw=$(next_password)
  ensure_user root "$pw"
  user_roles root | grep -qxF root || ctl user grant-role root root >/dev/null
  ctl auth enable >/dev/null
  echo "ff-etcd-auth: authentication is on"
}

case $what in
  enable) (($# == 0)) || usage; enable ;;
  node)
    (($# >= 1)) || usage
    for n in "$@"; do
      valid_name "$n" || { echo "ff-etcd-auth: '$n' is not a node name (a DNS subdomain)" >&2; exit 2; }
      # With --client-cert-auth a certificate with CN root is etcd's root user.
      [[ $n != root ]] || { echo "ff-etcd-auth: 'root' is etcd's root user, not a node name" >&2; exit 2; }
    done
    for n in "$@"; do
      pw=
      ((stdin_passwords == 0)) || pw=$(next_password)
      make_node "$n" "$pw"
    done
    ;;
  *) usage ;;
esac
