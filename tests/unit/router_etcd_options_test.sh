#!/usr/bin/env bash
# ffrouter's etcd TLS and auth options (--etcd-* flags, ETCDCTL_* environment) reach the
# control plane: each misconfiguration stops the router at start with a message naming the
# flag or file, the environment fills in what the flags leave out, flags win over it, and
# --etcd-user USER:PASSWORD is split as etcdctl splits it. No etcd needed: every case fails
# before the router connects, or (with --dir missing) right after the control plane is made.
set -uo pipefail
router=$1 certs=$2
dir=$(mktemp -d /tmp/ff-router-etcd-options.XXXXXX)
trap 'rm -rf "$dir"' EXIT
failures=0
bash "$certs" "$dir" ca >/dev/null && bash "$certs" "$dir" node node-a node-b >/dev/null || exit 1

# run ARGS...: ffrouter with the basics, at most 10 s; its output in $out, exit code in $rc.
run() {
  out=$(timeout 10 "$router" --vnet-prefix 10.244.0.0/16 --host-ip 127.0.0.1 --library /dev/null \
    --dir "$dir/missing" --name ff --log-level warn "$@" 2>&1)
  rc=$?
}
# expect NAME TEXT ARGS...: the router exits non-zero and says TEXT.
expect() {
  local name=$1 text=$2
  shift 2
  run "$@"
  if [[ $rc -ne 0 && $rc -ne 124 && $out == *"$text"* ]]; then
    echo "PASS $name"
  else
    echo "FAIL $name (exit $rc): $out"
    failures=$((failures + 1))
  fi
}
# verdict NAME STATUS: PASS when STATUS is 0, else FAIL with the router's output.
verdict() {
  if [[ $2 -eq 0 ]]; then
    echo "PASS $1"
  else
    echo "FAIL $1: $out"
    failures=$((failures + 1))
  fi
}
ep=etcd:https://127.0.0.1:1

expect "a certificate without its key" "without its key: give --etcd-key" \
  --control-plane "$ep" --etcd-cert "$dir/node-a.crt"
expect "an unreadable CA file is named" "cannot read etcd CA (--etcd-cacert) file $dir/nope.crt" \
  --control-plane "$ep" --etcd-cacert "$dir/nope.crt"
expect "a key of another certificate" "$dir/node-b.key does not belong to the certificate in $dir/node-a.crt" \
  --control-plane "$ep" --etcd-cert "$dir/node-a.crt" --etcd-key "$dir/node-b.key"
expect "TLS files with http://" "\"http://127.0.0.1:1\" is plaintext (http://) but TLS files are given" \
  --control-plane etcd:http://127.0.0.1:1 --etcd-cacert "$dir/ca.crt"
expect "a user without a password" "etcd user \"node-a\" has no password" \
  --control-plane "$ep" --etcd-user node-a
out=$(ETCDCTL_CERT=$dir/node-a.crt ETCDCTL_KEY=$dir/node-b.key timeout 10 "$router" \
  --vnet-prefix 10.244.0.0/16 --host-ip 127.0.0.1 --library /dev/null --dir "$dir/missing" \
  --control-plane "$ep" 2>&1)
[[ $? -ne 0 && $out == *"$dir/node-b.key does not belong"* ]]
verdict "ETCDCTL_CERT and ETCDCTL_KEY are read" $?
out=$(ETCDCTL_CACERT=$dir/env.crt timeout 10 "$router" --vnet-prefix 10.244.0.0/16 --host-ip 127.0.0.1 \
  --library /dev/null --dir "$dir/missing" --control-plane "$ep" --etcd-cacert "$dir/flag.crt" 2>&1)
[[ $? -ne 0 && $out == *"file $dir/flag.crt"* && $out != *env.crt* ]]
verdict "the flag wins over ETCDCTL_CACERT" $?
out=$(ETCDCTL_USER=node-a ETCDCTL_PASSWORD='' timeout 10 "$router" --vnet-prefix 10.244.0.0/16 --host-ip 127.0.0.1 \
  --library /dev/null --dir "$dir/missing" --control-plane "$ep" 2>&1)
[[ $? -ne 0 && $out == *'etcd user "node-a" has no password'* ]]
verdict "ETCDCTL_USER is read" $?
# USER:PASSWORD is split (the plaintext warning names the user alone); with a password
# given apart, the whole value is the user. The missing --dir then stops the router.
expect "--etcd-user USER:PASSWORD is split" 'etcd user "node-a" authenticates over plaintext' \
  --control-plane etcd:http://127.0.0.1:1 --etcd-user node-a:s3cret
[[ $out != *s3cret* ]]
verdict "the password is not logged" $?
expect "with --etcd-password the user is taken whole" 'etcd user "node-a:x" authenticates over plaintext' \
  --control-plane etcd:http://127.0.0.1:1 --etcd-user node-a:x --etcd-password s3cret
exit $((failures != 0))
