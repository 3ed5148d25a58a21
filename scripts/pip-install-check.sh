#!/usr/bin/env bash
# `pip install .` into a fresh virtual environment, then use it: run inside
# the Debian trixie root (scripts/trixie-env.sh, which installs
# python3-scikit-build-core, python3-venv and python3-pip there), since
# bookworm packages no scikit-build-core and the build does not reach PyPI:
#
#   scripts/trixie-env.sh run bash scripts/pip-install-check.sh
#
# The venv sees the system's packages (torch and NumPy from Debian);
# --no-build-isolation --no-index: scikit-build-core and CMake come from
# Debian too. The package is built from a copy of the tree's files (tracked
# and untracked, not ignored), as a user's checkout would be.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d /tmp/halka-pip.XXXXXX)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/src"
(cd "$repo" && git ls-files -co --exclude-standard | tar -cf - -T -) |
  tar -xf - -C "$work/src"
python3 -m venv --system-site-packages "$work/venv"
"$work/venv/bin/pip" install --no-build-isolation --no-index "$work/src"
cd /
"$work/venv/bin/python" - <<'PY'
import concurrent.futures as cf
import numpy as np
import halka
print("halka from", halka.__file__)
cluster = halka.LocalCluster(2)
clients = [cluster.connect(r) for r in range(2)]
bufs = [np.arange(8, dtype=np.int8) * (r + 1) for r in range(2)]
with cf.ThreadPoolExecutor(2) as ex:
    list(ex.map(lambda r: clients[r].all_reduce(bufs[r]), range(2)))
assert bufs[0].tolist() == [3 * i for i in range(8)], bufs[0]
cluster.close()
print("int8 all_reduce over the installed package:", bufs[0].tolist())
try:
    import torch
except ImportError:
    print("no torch: halka.torch not checked")
else:
    import halka.torch  # noqa: F401 registers the backend
    print("halka.torch registered with torch", torch.__version__)
PY
