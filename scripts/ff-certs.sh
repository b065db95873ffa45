#!/usr/bin/env bash
# Makes the certificates of a small freeflow cluster: one CA, and one certificate per node,
# for authenticated router-to-router links (issue 10). In a cluster the CA's certificate and
# each node's key and certificate go into a Secret that the router DaemonSet mounts.
#
#   ff-certs.sh [-d DAYS] [-f] DIR ca                   the CA: DIR/ca.key, DIR/ca.crt
#   ff-certs.sh [-d DAYS] [-f] [-i IP] DIR node NAME...  per node: DIR/NAME.key, DIR/NAME.crt
#
# A node certificate names its node (the router's --node-name, as the control plane knows
# it) as its subject CN and as a DNS subjectAltName, and may serve and dial links
# (extendedKeyUsage serverAuth and clientAuth). The same certificate is the router's etcd
# client certificate: etcd with --client-cert-auth takes the CN as the etcd user. -i IP
# (repeatable) adds an IP subjectAltName, for a server that clients reach by address, such
# as etcd at https://127.0.0.1:2379 (ff-certs.sh -i 127.0.0.1 DIR node localhost). Keys are
# EC P-256, written 0600. An existing key or certificate is never overwritten unless -f is
# given. DAYS defaults to 365.
set -euo pipefail

days=365
force=0
ips=()
usage() {
  sed -n '6,7p' "$0" | sed 's/^# */usage: /' >&2
  exit 2
}
while getopts "d:fi:" opt; do
  case $opt in
    d) days=$OPTARG ;;
    f) force=1 ;;
    i) ips+=("$OPTARG") ;;
    *) usage ;;
  esac
done
shift $((OPTIND - 1))
(($# >= 2)) || usage
dir=$1 what=$2
shift 2
[[ $days =~ ^[1-9][0-9]{0,4}$ ]] || { echo "ff-certs: -d wants a number of days, not '$days'" >&2; exit 2; }
octet='(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])'
for ip in "${ips[@]}"; do
  [[ $ip =~ ^$octet\.$octet\.$octet\.$octet$ ]] || { echo "ff-certs: -i wants an IPv4 address, not '$ip'" >&2; exit 2; }
done
command -v openssl >/dev/null || { echo "ff-certs: openssl is missing (apt-get install openssl)" >&2; exit 1; }
umask 077
mkdir -p "$dir"

# fresh FILE...: fails unless each FILE is absent or -f was given.
fresh() {
  local f
  for f in "$@"; do
    if [[ -e $f && $force -eq 0 ]]; then
      echo "ff-certs: $f exists; -f replaces it" >&2
      return 1
    fi
  done
}

make_ca() {
  fresh "$dir/ca.key" "$dir/ca.crt" || exit 1
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$dir/ca.key" 2>/dev/null
  openssl req -x509 -new -key "$dir/ca.key" -sha256 -days "$days" -subj "/CN=freeflow cluster CA" \
    -addext "basicConstraints=critical,CA:TRUE,pathlen:0" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" -out "$dir/ca.crt"
  chmod 0644 "$dir/ca.crt"
  echo "ff-certs: CA in $dir/ca.crt (key $dir/ca.key)"
}

# A node name as Kubernetes allows it (a DNS subdomain): lower-case letters, digits, '-' and
# '.', at most 253 characters, starting and ending with a letter or digit.
valid_name() {
  [[ ${#1} -le 253 && $1 =~ ^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$ ]]
}

make_node() {
  local name=$1 ext san ip
  valid_name "$name" || { echo "ff-certs: '$name' is not a node name (a DNS subdomain)" >&2; exit 2; }
  [[ -f $dir/ca.key && -f $dir/ca.crt ]] || { echo "ff-certs: no CA in $dir; run '$0 $dir ca' first" >&2; exit 1; }
  fresh "$dir/$name.key" "$dir/$name.crt" || exit 1
  ext=$(mktemp)
  trap 'rm -f "$ext" "$dir/$name.csr"' RETURN
  san="DNS:$name"
  for ip in "${ips[@]}"; do san+=",IP:$ip"; done
  printf '%s\n' "basicConstraints=critical,CA:FALSE" "keyUsage=critical,digitalSignature" \
    "extendedKeyUsage=serverAuth,clientAuth" "subjectAltName=$san" >"$ext"
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$dir/$name.key" 2>/dev/null
  openssl req -new -key "$dir/$name.key" -subj "/CN=$name" -out "$dir/$name.csr"
  openssl x509 -req -in "$dir/$name.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial \
    -days "$days" -sha256 -extfile "$ext" -out "$dir/$name.crt" 2>/dev/null
  chmod 0644 "$dir/$name.crt"
  echo "ff-certs: node $name in $dir/$name.crt (key $dir/$name.key)"
}

case $what in
  ca)
    (($# == 0)) || usage
    ((${#ips[@]} == 0)) || { echo "ff-certs: -i is for node certificates, not the CA" >&2; exit 2; }
    make_ca
    ;;
  node)
    (($# >= 1)) || usage
    for n in "$@"; do make_node "$n"; done
    ;;
  *) usage ;;
esac
