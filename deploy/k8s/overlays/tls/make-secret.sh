#!/usr/bin/env bash
# make-secret.sh NAMESPACE [JOB [DIR]]: prints the Secret halka-tls that
# deploy/k8s/overlays/tls mounts, for a job JOB (default: halka, as
# HALKA_JOB in base/config.yaml) in NAMESPACE:
#
#   ca.pem             the job's CA
#   tls.pem, tls.key   one certificate for every pod, signed by the CA, for
#                      the names the pods dial: halka-rendezvous,
#                      *.halka-worker and *.halka-ps under .NAMESPACE.svc
#                      (and .cluster.local), the short names of
#                      $HALKA_WORKERS workers (default 4) and $HALKA_SHARDS
#                      parameter servers (default 1), localhost, 127.0.0.1
#   token              the job's secret token
#   job-tokens         the rendezvous' table: "JOB token"
#
# DIR (default ./halka-tls-NAMESPACE) keeps the CA's key and the files, to
# issue more certificates later (scripts/certs.sh DIR NAME=SAN,...). Apply:
#   deploy/k8s/overlays/tls/make-secret.sh NAMESPACE | kubectl apply -n NAMESPACE -f -
set -euo pipefail
ns=${1:?usage: make-secret.sh NAMESPACE [JOB [DIR]]}
job=${2:-halka}
dir=${3:-halka-tls-$ns}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
[[ $ns =~ ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$ ]] || { echo "make-secret.sh: '$ns' is not a namespace name" >&2; exit 2; }
names=""
for svc in halka-rendezvous '*.halka-worker' '*.halka-ps'; do
  names+="$svc.$ns.svc,$svc.$ns.svc.cluster.local,"
done
# gRPC matches a wildcard only under two labels or more (*.halka-ps.NS.svc,
# not *.halka-ps): the short names are listed one by one
names+="halka-rendezvous,"
for (( r = 0; r < ${HALKA_WORKERS:-4}; ++r )); do names+="halka-worker-$r.halka-worker,"; done
for (( r = 0; r < ${HALKA_SHARDS:-1}; ++r )); do names+="halka-ps-$r.halka-ps,"; done
"$here/../../../../scripts/certs.sh" "$dir" "tls=${names%,}" >/dev/null
printf '%s %s\n' "$job" "$(cat "$dir/token")" >"$dir/job-tokens"
echo "make-secret.sh: CA and files kept in $dir" >&2
cat <<YAML
apiVersion: v1
kind: Secret
metadata:
  name: halka-tls
  labels:
    app.kubernetes.io/name: halka
    app.kubernetes.io/part-of: halka
type: Opaque
data:
YAML
for f in ca.pem tls.pem tls.key token job-tokens; do
  printf '  %s: %s\n' "$f" "$(base64 -w0 <"$dir/$f")"
done
