#!/usr/bin/env bash
# deploy/compose/make-certs.sh [DIR]: the files compose.tls.yaml mounts
# (default DIR: deploy/compose/tls, next to this script; set HALKA_TLS_DIR
# to DIR when it is elsewhere):
#
#   ca.pem                      the job's CA (every service requires peers
#                               to present a certificate it signed)
#   SERVICE.pem, SERVICE.key    one per service: rendezvous, worker-0..3,
#                               ps, bench (SAN DNS:SERVICE, for its
#                               Compose hostname)
#   token                       the job's secret token
#   job-tokens                  the rendezvous' table: "$HALKA_JOB token"
#                               (HALKA_JOB as in compose.yaml: default
#                               compose); other jobs are refused
#   rogue-ca.pem, rogue.pem/key a certificate from an unrelated CA, for
#                               checking that it is refused
#
# The containers run as uid 10001: run as root, the keys and the token
# become that uid's (mode 0600); otherwise they are made readable by every
# local user, and this says so. Test material, not key management.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
dir=${1:-$here/tls}
job=${HALKA_JOB:-compose}
services=(rendezvous worker-0 worker-1 worker-2 worker-3 ps bench)
"$here/../../scripts/certs.sh" "$dir" "${services[@]}" >/dev/null
printf '%s %s\n' "$job" "$(cat "$dir/token")" >"$dir/job-tokens"
secret=("$dir"/*.key "$dir/token" "$dir/job-tokens")
if [[ $(id -u) -eq 0 ]]; then
  chown 10001:10001 "${secret[@]}"
  chmod 0600 "${secret[@]}"
else
  chmod 0644 "${secret[@]}"
  echo "make-certs.sh: not root, so the keys and the token in $dir are readable by every local user (the containers' uid 10001 must read them)" >&2
fi
chmod 0755 "$dir"
echo "make-certs.sh: CA, certificates for ${services[*]}, token for job $job in $dir"
