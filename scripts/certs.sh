#!/usr/bin/env bash
# Makes a test CA and per-host certificates for halka's TLS and mutual TLS.
#
#   scripts/certs.sh OUTDIR [HOST...]      (default host: localhost)
#
# Writes, all PEM:
#   OUTDIR/ca.pem, ca.key                  the job's CA (--tls_ca)
#   OUTDIR/HOST.pem, HOST.key              per host, signed by the CA, usable
#                                          as server and client certificate
#                                          (--tls_cert/--tls_key); SANs:
#                                          DNS:HOST, DNS:localhost, IP:127.0.0.1
#   (a HOST argument NAME=SAN,SAN,... writes NAME.pem/NAME.key for those
#   names instead, e.g. tls='*.halka-worker.ns.svc,halka-rendezvous')
#   OUTDIR/rogue-ca.pem, rogue.pem, rogue.key
#                                          a second, unrelated CA and a
#                                          certificate from it, for tests that
#                                          must be refused
#   OUTDIR/token                           a random job token (--job_token_file)
# For tests and the Compose example, not for production key management.
set -euo pipefail
out=${1:?usage: certs.sh OUTDIR [HOST...]}
shift
hosts=("$@")
[ ${#hosts[@]} -gt 0 ] || hosts=(localhost)
command -v openssl >/dev/null || { echo "certs.sh: openssl not found (apt-get install openssl)" >&2; exit 1; }
mkdir -p "$out"
umask 077
days=${HALKA_CERT_DAYS:-825}

make_ca() {  # NAME CN
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$out/$1.key" -out "$out/$1.pem" -days "$days" -subj "/CN=$2" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
}

make_leaf() {  # CA NAME HOST[,HOST...]
  local ca=$1 name=$2 host=${3%%,*} ext h san="" names=()
  ext=$(mktemp)
  IFS=, read -ra names <<<"$3"
  for h in "${names[@]}" localhost 127.0.0.1; do
    if [[ $h =~ ^[0-9.]+$ ]]; then san+="IP:$h,"; else san+="DNS:$h,"; fi
  done
  san=${san%,}
  printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\nsubjectAltName=%s\n' "$san" >"$ext"
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$out/$name.key" -out "$out/$name.csr" -subj "/CN=$host" 2>/dev/null
  openssl x509 -req -in "$out/$name.csr" -CA "$out/$ca.pem" -CAkey "$out/$ca.key" \
    -CAcreateserial -out "$out/$name.pem" -days "$days" -extfile "$ext" 2>/dev/null
  rm -f "$out/$name.csr" "$ext"
}

[ -f "$out/ca.pem" ] || make_ca ca halka-test-ca
[ -f "$out/rogue-ca.pem" ] || make_ca rogue-ca halka-rogue-ca
for h in "${hosts[@]}"; do
  if [[ $h == *=* ]]; then make_leaf ca "${h%%=*}" "${h#*=}"; else make_leaf ca "$h" "$h"; fi
done
make_leaf rogue-ca rogue localhost
[ -f "$out/token" ] || openssl rand -hex 32 >"$out/token"
chmod 644 "$out"/*.pem
echo "certs.sh: CA, ${#hosts[@]} host certificate(s), rogue CA and token in $out"
