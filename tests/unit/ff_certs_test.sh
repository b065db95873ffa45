#!/usr/bin/env bash
# scripts/ff-certs.sh: a CA and node certificates that verify against it, name their node,
# serve and dial (serverAuth, clientAuth), keep their keys private, and are never
# overwritten by accident; bad names and a missing CA are refused.
set -uo pipefail
certs=$1
dir=$(mktemp -d /tmp/ff-certs-test.XXXXXX)
trap 'rm -rf "$dir"' EXIT
failures=0
check() { if eval "$2"; then echo "PASS $1"; else echo "FAIL $1"; failures=$((failures + 1)); fi; }

check "no CA yet: a node certificate is refused" "! '$certs' '$dir' node node-a 2>/dev/null"
check "the CA is made" "'$certs' '$dir' ca >/dev/null"
check "two node certificates are made" "'$certs' -d 30 '$dir' node node-a node-b.example >/dev/null"
for n in node-a node-b.example; do
  check "$n verifies against the CA" "openssl verify -CAfile '$dir/ca.crt' '$dir/$n.crt' >/dev/null"
  check "$n is the subject's CN" "openssl x509 -in '$dir/$n.crt' -noout -subject | grep -q 'CN = $n\$'"
  check "$n is its DNS name" "openssl x509 -in '$dir/$n.crt' -noout -ext subjectAltName | grep -q 'DNS:$n\$'"
  check "$n may serve and dial" "openssl x509 -in '$dir/$n.crt' -noout -ext extendedKeyUsage | grep -q 'Server Authentication, TLS Web Client'"
  check "$n's key is private (0600)" "[[ \$(stat -c %a '$dir/$n.key') == 600 ]]"
  check "$n's key matches its certificate" "[[ \$(openssl pkey -in '$dir/$n.key' -pubout) == \$(openssl x509 -in '$dir/$n.crt' -noout -pubkey) ]]"
done
check "the CA certificate is a CA" "openssl x509 -in '$dir/ca.crt' -noout -ext basicConstraints | grep -q 'CA:TRUE'"
check "a node certificate is not a CA" "openssl x509 -in '$dir/node-a.crt' -noout -ext basicConstraints | grep -q 'CA:FALSE'"
check "a node certificate lasts the days asked for" "openssl x509 -in '$dir/node-a.crt' -noout -checkend \$((29 * 86400)) >/dev/null && ! openssl x509 -in '$dir/node-a.crt' -noout -checkend \$((31 * 86400)) >/dev/null"
# shellcheck disable=SC2034  # read by the checks, which eval their condition
before=$(sha256sum "$dir/node-a.key" "$dir/ca.key")
check "an existing node key is not overwritten" "! '$certs' '$dir' node node-a 2>/dev/null"
check "an existing CA is not overwritten" "! '$certs' '$dir' ca 2>/dev/null"
check "both keys are as they were" "[[ \$(sha256sum '$dir/node-a.key' '$dir/ca.key') == \"\$before\" ]]"
check "-f replaces a node certificate" "'$certs' -f '$dir' node node-a >/dev/null && [[ \$(sha256sum '$dir/node-a.key') != \$(head -n 1 <<<\"\$before\") ]]"
for bad in Node-A "node a" "node/a" -node "" "a..b/c" "$(printf 'x%.0s' {1..254})"; do
  check "'${bad:0:20}' is refused as a node name" "! '$certs' '$dir' node '$bad' 2>/dev/null && [[ ! -e '$dir/$bad.key' ]]"
done
check "a bad -d is refused" "! '$certs' -d 0 '$dir' node node-c 2>/dev/null"
# -i: IP subjectAltNames, for a server reached by address (etcd at https://127.0.0.1:2379).
check "-i adds IP names" "'$certs' -i 127.0.0.1 -i 10.0.0.7 '$dir' node localhost >/dev/null"
check "the certificate names its DNS name and both IPs" "openssl x509 -in '$dir/localhost.crt' -noout -ext subjectAltName | grep -q 'DNS:localhost, IP Address:127.0.0.1, IP Address:10.0.0.7\$'"
check "it verifies for 127.0.0.1" "openssl verify -CAfile '$dir/ca.crt' -verify_ip 127.0.0.1 '$dir/localhost.crt' >/dev/null"
check "it does not verify for another address" "! openssl verify -CAfile '$dir/ca.crt' -verify_ip 127.0.0.2 '$dir/localhost.crt' >/dev/null 2>&1"
check "without -i no IP is named" "! openssl x509 -in '$dir/node-b.example.crt' -noout -ext subjectAltName | grep -q 'IP Address'"
for bad in 256.0.0.1 1.2.3 ::1 "1.2.3.4 " 01.2.3.4x; do
  check "-i '$bad' is refused" "! '$certs' -i '$bad' '$dir' node node-d 2>/dev/null && [[ ! -e '$dir/node-d.key' ]]"
done
check "-i is refused for the CA" "! '$certs' -f -i 127.0.0.1 '$dir' ca 2>/dev/null"
exit $((failures != 0))
