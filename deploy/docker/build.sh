#!/usr/bin/env bash
# Builds halka's container image from this checkout.
#
#   deploy/docker/build.sh [--cuda | --prometheus] [--tag TAG] [--base IMAGE]
#                          [--runtime-base IMAGE] [--jobs N] [--dry-run]
#                          [-- EXTRA DOCKER BUILD ARGS...]
#
#   (default)  FROM debian:bookworm-slim, HALKA_CUDA=OFF  -> halka:latest
#   --cuda     FROM nvidia/cuda:$CUDA_VERSION-devel-ubuntu24.04 (build) and
#              nvidia/cuda:$CUDA_VERSION-runtime-ubuntu24.04 (runtime),
#              HALKA_CUDA=ON                               -> halka:cuda
#   --prometheus Debian's prometheus on the same base, for the Compose
#              stack's observability profile (prometheus.Dockerfile,
#              context deploy/docker)       -> halka-prometheus:latest
#   --dry-run  print the docker command and the files of the context
#
# The context is the repository root, narrowed to what the Dockerfile
# copies (streamed as a tar), so a big build/ directory is never sent.
# Set DOCKER to choose the client (default: docker).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
DOCKER=${DOCKER:-docker}
CUDA_VERSION=${CUDA_VERSION:-12.6.3}
# What the Dockerfile COPYs; keep in sync with it.
CONTEXT=(CMakeLists.txt proto common core seal codec transport worker server client bench
         scripts/install-deps.sh deploy/docker)

cuda=0 prometheus=0 tag="" base="" runtime_base="" jobs="" dry=0 extra=()
while (( $# )); do
  case $1 in
    --cuda) cuda=1 ;;
    --prometheus) prometheus=1 ;;
    --tag) tag=$2; shift ;;
    --base) base=$2; shift ;;
    --runtime-base) runtime_base=$2; shift ;;
    --jobs) jobs=$2; shift ;;
    --dry-run) dry=1 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

# --force-rm: the legacy builder otherwise keeps the container (and its
# layers, ~600 MB here) of a failed step
args=(build --force-rm -f deploy/docker/Dockerfile)
if (( prometheus )); then
  (( cuda )) && { echo "build.sh: --prometheus and --cuda are two images" >&2; exit 2; }
  args=(build --force-rm -f deploy/docker/prometheus.Dockerfile)
  CONTEXT=(deploy/docker/prometheus.Dockerfile)
  tag=${tag:-halka-prometheus:latest}
elif (( cuda )); then
  base=${base:-nvidia/cuda:$CUDA_VERSION-devel-ubuntu24.04}
  runtime_base=${runtime_base:-nvidia/cuda:$CUDA_VERSION-runtime-ubuntu24.04}
  tag=${tag:-halka:cuda}
  args+=(--build-arg HALKA_CUDA=ON)
else
  tag=${tag:-halka:latest}
  args+=(--build-arg HALKA_CUDA=OFF)
fi
[[ -n $base ]] && args+=(--build-arg "BASE=$base")
[[ -n $runtime_base ]] && args+=(--build-arg "RUNTIME_BASE=$runtime_base")
[[ -n $jobs ]] && args+=(--build-arg "JOBS=$jobs")
args+=(-t "$tag" ${extra[@]+"${extra[@]}"} -)

cd "$ROOT"
if (( dry )); then
  printf '%q ' "$DOCKER" "${args[@]}"; echo "< context.tar"
  tar -c "${CONTEXT[@]}" | tar -t
  exit 0
fi
tar -c --owner=0 --group=0 "${CONTEXT[@]}" | "$DOCKER" "${args[@]}"
