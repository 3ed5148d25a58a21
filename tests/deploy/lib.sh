# shellcheck shell=bash
# Helpers shared by the deploy tests (source it).

DEPLOY_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

now_ms() { echo $(( $(date +%s%N) / 1000000 )); }
secs() { awk -v ms="$1" 'BEGIN { printf "%.1f", ms / 1000.0 }'; }
log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*"; }
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576.0 }'; }

# apt_install PKG...: installs the packages that are missing (as root).
apt_install() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
      missing+=("$p")
  done
  (( ${#missing[@]} )) || return 0
  log "installing ${missing[*]}"
  nice -n 10 apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive nice -n 10 apt-get install -y -qq \
      --no-install-recommends "${missing[@]}" >/dev/null
}

# setup_validator: sets VALIDATOR to a directory holding
# tests/deploy/validate/*.mjs next to the node_modules of its
# package-lock.json (npm ci from the npm registry once per lock file, then
# cached under /var/cache/halka-deploy or ~/.cache/halka-deploy).
VALIDATOR=""
setup_validator() {
  local src=$DEPLOY_ROOT/tests/deploy/validate cache hash
  if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    if [[ $(id -u) -eq 0 ]]; then apt_install nodejs npm || return 1; fi
    command -v node >/dev/null && command -v npm >/dev/null || {
      echo "node and npm are needed (apt-get install nodejs npm)" >&2; return 1; }
  fi
  if [[ $(id -u) -eq 0 ]]; then cache=/var/cache/halka-deploy
  else cache=${XDG_CACHE_HOME:-$HOME/.cache}/halka-deploy; fi
  hash=$(cat "$src/package.json" "$src/package-lock.json" | sha256sum | cut -c1-16)
  VALIDATOR=$cache/validate-$hash
  mkdir -p "$cache" || return 1
  (
    flock 9
    if [[ ! -f $VALIDATOR/.installed ]]; then
      rm -rf "$VALIDATOR" && mkdir -p "$VALIDATOR" &&
        cp "$src/package.json" "$src/package-lock.json" "$VALIDATOR/" &&
        (cd "$VALIDATOR" && nice -n 10 npm ci --no-audit --no-fund --loglevel=error >npm.log 2>&1) ||
        { cat "$VALIDATOR/npm.log" >&2 2>/dev/null; exit 1; }
      touch "$VALIDATOR/.installed"
    fi
    cp "$src"/*.mjs "$VALIDATOR/"
  ) 9>"$cache/.lock"
}
