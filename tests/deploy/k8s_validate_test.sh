#!/usr/bin/env bash
# Deploy test: strict offline validation of deploy/k8s (no cluster needed).
#
#   1. renders deploy/k8s/base, overlays/gpu, overlays/prometheus-operator
#      (a PodMonitor), overlays/tls (with the Secret
#      its make-secret.sh prints), overlays/tls-bench and bench with `kubectl
#      kustomize` (kubectl >= 1.21: kustomize v4+) and with kustomize-lite.mjs,
#      the repo's own stand-in, and asserts both give the same objects (the
#      stand-in renders alone where there is no kubectl)
#   2. validates each rendered set with k8s-validate.mjs: the official
#      OpenAPI schemas (kubernetes-models), no unknown fields
#      (@kubernetes/client-node's models), and the cross-object and halka
#      rules listed in that file
#   3. checks that the gpu overlay's image is what `deploy/docker/build.sh
#      --cuda` tags, and that the CUDA build arguments exist in the Dockerfile
#      (the CUDA image itself needs an nvidia/cuda base: validated statically)
#   4. renders every tests/deploy/broken/k8s/* overlay and asserts the
#      validator rejects it with the message in its `expect` file
#
# The validator's npm packages are installed once per package-lock.json
# (npm ci) and cached. HALKA_DEPLOY_RENDERER=lite skips kubectl. Exits 0
# only if every check holds.
set -u -o pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ROOT=$DEPLOY_ROOT
K8S=$ROOT/deploy/k8s
WORK=$(mktemp -d /tmp/halka-deploy-k8s.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
PASSED=0 FAILED=0
ok() { PASSED=$(( PASSED + 1 )); printf 'ok    %s\n' "$*"; }
bad() { FAILED=$(( FAILED + 1 )); printf 'FAIL  %s\n' "$*"; }

setup_validator || { echo "FAIL: cannot install the validator's npm packages"; exit 1; }
V=$VALIDATOR

# ------------------------------------------------------------ renderer
KUBECTL=""
# HALKA_DEPLOY_RENDERER=lite: render with kustomize-lite.mjs alone
if [[ ${HALKA_DEPLOY_RENDERER:-} != lite ]] && command -v kubectl >/dev/null 2>&1; then
  kv=$(kubectl version --client 2>/dev/null | sed -n 's/^Kustomize Version: v\{0,1\}\([0-9]*\).*/\1/p')
  if [[ -n $kv ]] && (( kv >= 4 )); then
    KUBECTL=kubectl
    log "renderer: kubectl kustomize ($(kubectl version --client 2>/dev/null | tr '\n' ' ')) + kustomize-lite.mjs"
  fi
fi
[[ -n $KUBECTL ]] || log "renderer: kustomize-lite.mjs (no kubectl with kustomize v4+ here)"

# render DIR OUT: renders with kubectl (and compares kustomize-lite with it)
# or with kustomize-lite alone. Returns 1 (message in OUT.err) on failure.
render() {
  local dir=$1 out=$2
  if ! node "$V/kustomize-lite.mjs" "$dir" >"$out.lite" 2>"$out.err"; then
    [[ -z $KUBECTL ]] && return 1
    echo "kustomize-lite could not render it: $(cat "$out.err")" >"$out.err"
    return 1
  fi
  if [[ -n $KUBECTL ]]; then
    kubectl kustomize "$dir" >"$out" 2>"$out.err" || return 1
    if ! node "$V/kustomize-lite.mjs" --compare "$out" "$out.lite" >"$out.err" 2>&1; then
      sed -i '1i kustomize-lite.mjs and kubectl kustomize disagree:' "$out.err"
      return 1
    fi
  else
    mv "$out.lite" "$out"
  fi
}

# ------------------------------------------------------------ 1+2. real manifests
check_set() {  # check_set NAME DIR|FILE... : renders each DIR, validates all as one set
  local name=$1; shift
  local files=() d out
  for d in "$@"; do
    if [[ -f $d ]]; then files+=("$d"); continue; fi
    out=$WORK/$name-$(basename "$d").yaml
    if ! render "$d" "$out"; then
      bad "$name: rendering ${d#"$ROOT"/} failed: $(head -c 2000 "$out.err")"
      return 1
    fi
    files+=("$out")
  done
  if node "$V/k8s-validate.mjs" --name "$name" "${files[@]}" >"$WORK/$name.out" 2>&1; then
    ok "$(tail -n 1 "$WORK/$name.out")"
    for d in "${files[@]}"; do cat "$d"; echo "---"; done >"$WORK/$name.all.yaml"
  else
    bad "$name rejected:"
    sed 's/^/      /' "$WORK/$name.out"
    return 1
  fi
}
check_set base "$K8S/base"
check_set gpu "$K8S/overlays/gpu"
check_set base+bench "$K8S/base" "$K8S/bench"
check_set prometheus-operator "$K8S/overlays/prometheus-operator"
# The TLS overlay with the Secret its script makes (the validator checks the
# files it names against the Secret's keys), and the bench over TLS.
if HALKA_WORKERS=4 "$K8S/overlays/tls/make-secret.sh" halka-test halka "$WORK/tls-ca" \
     >"$WORK/secret.yaml" 2>"$WORK/secret.err"; then
  check_set tls "$K8S/overlays/tls" "$WORK/secret.yaml"
  check_set tls+bench "$K8S/overlays/tls" "$K8S/overlays/tls-bench" "$WORK/secret.yaml"
  sans=$(openssl x509 -in "$WORK/tls-ca/tls.pem" -noout -ext subjectAltName 2>&1)
  if grep -q 'DNS:halka-worker-3.halka-worker,' <<<"$sans" &&
     grep -q 'DNS:\*.halka-worker.halka-test.svc,' <<<"$sans" &&
     grep -q 'DNS:halka-rendezvous,' <<<"$sans" &&
     openssl verify -CAfile "$WORK/tls-ca/ca.pem" "$WORK/tls-ca/tls.pem" >/dev/null 2>&1; then
    ok "tls: make-secret.sh's certificate verifies against its CA and names the Services' pods"
  else
    bad "tls: make-secret.sh's certificate: $sans"
  fi
else
  bad "make-secret.sh failed: $(cat "$WORK/secret.err")"
fi

# A few facts about the rendered sets, read back with node.
facts() {  # facts FILE JS-EXPR-over-objects -> prints the value
  node --input-type=module -e "
    import fs from 'node:fs'; import YAML from '$V/node_modules/yaml/dist/index.js';
    const objs = YAML.parseAllDocuments(fs.readFileSync('$1', 'utf8')).map(d => d.toJS()).filter(Boolean);
    const sts = n => objs.find(o => o.kind === 'StatefulSet' && o.metadata.name === n);
    console.log(JSON.stringify($2));" 2>&1
}
if [[ -f $WORK/gpu.all.yaml && -f $WORK/base.all.yaml ]]; then
  got=$(facts "$WORK/gpu.all.yaml" "[sts('halka-worker').spec.template.spec.containers[0].image, sts('halka-worker').spec.template.spec.containers[0].resources.limits['nvidia.com/gpu'], sts('halka-ps').spec.template.spec.containers[0].image]")
  if [[ $got == '["halka:cuda",1,"halka:latest"]' ]]; then
    ok "gpu overlay: workers run halka:cuda with nvidia.com/gpu: 1, parameter servers stay on halka:latest"
  else
    bad "gpu overlay: worker image/GPU limit/ps image are $got"
  fi
  if [[ -f $WORK/tls.all.yaml ]]; then
    got=$(facts "$WORK/tls.all.yaml" "['halka-worker', 'halka-ps'].map(n => [sts(n).spec.template.spec.containers[0].readinessProbe.exec?.command?.[0], sts(n).spec.template.spec.containers[0].env.find(e => e.name === 'HALKA_INSECURE').value]).concat([objs.find(o => o.kind === 'ConfigMap').data.HALKA_TLS_CA])")
    if [[ $got == '[["halka-healthcheck","false"],["halka-healthcheck","false"],"/etc/halka/tls/ca.pem"]' ]]; then
      ok "tls overlay: exec probes (halka-healthcheck), HALKA_INSECURE=false, HALKA_TLS_CA in halka-config"
    else
      bad "tls overlay: probes/insecure/CA are $got"
    fi
  fi
  got=$(facts "$WORK/base.all.yaml" "objs.every(o => o.metadata.labels?.['app.kubernetes.io/part-of'] === 'halka')")
  if [[ $got == true ]]; then
    ok "base: every object labelled app.kubernetes.io/part-of=halka"
  else
    bad "base: labels: $got"
  fi
fi

# ------------------------------------------------------------ 3. CUDA image (static)
dry=$("$ROOT/deploy/docker/build.sh" --cuda --dry-run 2>&1 | head -n 1)
cuda_tag=$(sed -n 's/.* -t \([^ ]*\) .*/\1/p' <<<"$dry")
if grep -q -- '--build-arg HALKA_CUDA=ON' <<<"$dry" &&
   grep -q -- '--build-arg BASE=nvidia/cuda:[^ ]*-devel-' <<<"$dry" &&
   grep -q -- '--build-arg RUNTIME_BASE=nvidia/cuda:[^ ]*-runtime-' <<<"$dry"; then
  ok "build.sh --cuda: HALKA_CUDA=ON on nvidia/cuda devel (build) and runtime bases -> $cuda_tag"
else
  bad "build.sh --cuda --dry-run: $dry"
fi
# shellcheck disable=SC2016  # literal ${...} in the Dockerfile
for a in 'ARG BASE=' 'ARG RUNTIME_BASE=${BASE}' 'ARG HALKA_CUDA=' 'FROM ${BASE} AS build' 'FROM ${RUNTIME_BASE} AS runtime' '-DHALKA_CUDA="${HALKA_CUDA}"'; do
  grep -qF -- "$a" "$ROOT/deploy/docker/Dockerfile" || bad "Dockerfile lacks: $a"
done
if grep -q '^# *syntax=' "$ROOT/deploy/docker/Dockerfile"; then bad "Dockerfile has a # syntax= line"; fi
if [[ -n $cuda_tag ]] && grep -qx "          image: $cuda_tag" "$K8S/overlays/gpu/workers-gpu.yaml"; then
  ok "gpu overlay's image = build.sh --cuda's tag ($cuda_tag)"
else
  bad "gpu overlay's image is not build.sh --cuda's tag '$cuda_tag'"
fi

# The Dockerfile must copy every top-level directory the non-test build
# uses: add_subdirectory() of the top-level CMakeLists (but tests/),
# ${PROJECT_SOURCE_DIR}/DIR in any copied CMakeLists, and #include "DIR/..."
# in copied sources; build.sh's context must hold the same.
copied=$(sed -n 's|^COPY \([a-z][A-Za-z0-9_.-]*\)/ .*|\1|p' "$ROOT/deploy/docker/Dockerfile" | sort -u)
needed=$(
  cd "$ROOT" || exit 1
  sed -n 's/^ *add_subdirectory(\([A-Za-z0-9_.-]*\)).*/\1/p' CMakeLists.txt | grep -vx tests
  for d in $copied; do
    grep -rhoE '\$\{(PROJECT|CMAKE)_SOURCE_DIR\}/[A-Za-z0-9_.-]+' --include=CMakeLists.txt "$d" |
      sed 's|.*}/||'
    grep -rhoE '#include "[A-Za-z0-9_.-]+/' --include='*.h' --include='*.cc' --include='*.cu' "$d" |
      sed 's|#include "||; s|/$||'
  done | while read -r t; do [[ -d $t && $t != tests ]] && echo "$t"; done
)
missing=$(comm -13 <(echo "$copied") <(sort -u <<<"$needed"))
context=$(sed -n '/^CONTEXT=(/,/)/p' "$ROOT/deploy/docker/build.sh")
for d in $copied; do grep -qw -- "$d" <<<"$context" || missing="$missing $d(build.sh)"; done
if [[ -z ${missing// /} ]]; then
  ok "Dockerfile copies every directory the build uses: $(tr '\n' ' ' <<<"$copied")"
else
  bad "Dockerfile/build.sh do not copy: $missing"
fi

# ------------------------------------------------------------ 4. broken copies
nb=0
for d in "$ROOT"/tests/deploy/broken/k8s/*/; do
  n=$(basename "$d")
  expect=$(head -n 1 "$d/expect")
  nb=$(( nb + 1 ))
  out=$WORK/broken-$n.yaml
  if ! render "$d" "$out"; then
    bad "broken/$n: does not render (it must render and be rejected by the validator): $(head -c 600 "$out.err")"
    continue
  fi
  if node "$V/k8s-validate.mjs" --name "broken/$n" "$out" >"$out.txt" 2>&1; then
    bad "broken/$n accepted (expected: $expect)"
  elif grep -qF -- "$expect" "$out.txt"; then
    ok "broken/$n rejected: $(grep -F -- "$expect" "$out.txt" | head -n 1 | sed "s|^broken/$n: ||")"
  else
    bad "broken/$n rejected, but not with '$expect':"
    sed 's/^/      /' "$out.txt"
  fi
done
(( nb >= 10 )) || bad "only $nb broken copies"

echo
echo "$PASSED passed, $FAILED failed"
(( FAILED == 0 ))
