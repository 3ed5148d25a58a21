#!/usr/bin/env bash
# Builds the CUDA reducer's test and benchmark HERE (a machine with nvcc but
# no GPU) and packs them, with every shared library they need that a bare
# GPU machine lacks, into bundle/ (git-ignored), for tests/cuda/run_on_gpu.sh.
#
#   bash tests/cuda/make_gpu_bundle.sh [BUILD_DIR] [BUNDLE_DIR]
#
# BUILD_DIR (default: build-cuda in the repository) is configured with
# -DHALKA_CUDA=ON if it has no CMakeCache.txt yet; only the two targets are
# built (JOBS=N for parallel jobs, default 1). BUNDLE_DIR defaults to bundle/
# in the repository. Then, with the device tool:
#
#   run(command="bash tests/cuda/run_on_gpu.sh", carry=["bundle"], timeout_s=540)
#
# Layout:
#   bundle/bin/    cuda_reduce_test, halka_cuda_reduce_bench (debug info
#                  stripped; the CUDA runtime is linked statically)
#   bundle/lib/    libabsl_*, libstdc++, libgcc_s, ... (everything ldd lists
#                  except glibc and the NVIDIA driver)
#   bundle/glibc/  this machine's glibc and loader, used by run_on_gpu.sh
#                  only if the GPU machine's own glibc is too old to run the
#                  binaries
#   bundle/certs/  throwaway TLS certificates (scripts/certs.sh) for
#                  bench/compare/run_on_host.sh's TLS step
#   bundle/MANIFEST.txt  what was built, where, and with which compilers
# If patchelf is installed the binaries also get RPATH $ORIGIN/../lib; the
# run script sets LD_LIBRARY_PATH either way.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=${1:-$REPO/build-cuda}
BUNDLE=${2:-$REPO/bundle}
JOBS=${JOBS:-1}
TARGETS=(cuda_reduce_test halka_cuda_reduce_bench device_tensor_test
         halka-rendezvous halka-worker halkactl halka-seal-bench)

if [[ ! -f "$BUILD/CMakeCache.txt" ]]; then
  cmake -S "$REPO" -B "$BUILD" -G Ninja -DHALKA_CUDA=ON
fi
# The CUDA compiler CMake found (none: the build has only the stub).
NVCC=$(sed -n 's/^set(CMAKE_CUDA_COMPILER "\(.*\)")$/\1/p' \
       "$BUILD"/CMakeFiles/*/CMakeCUDACompiler.cmake 2>/dev/null | head -1)
if [[ -z "$NVCC" ]]; then
  echo "error: $BUILD was not configured with CUDA (use -DHALKA_CUDA=ON)" >&2
  exit 1
fi
cmake --build "$BUILD" --target "${TARGETS[@]}" -j"$JOBS"
# Gloo's side of bench/compare (bench/compare/run_on_host.sh), when
# libgloo-dev is installed here (the GPU machine has no Gloo of its own).
GLOO_BENCH=""
if [[ -e /usr/include/gloo/allreduce_ring_chunked.h ]]; then
  GLOO_BENCH=$BUILD/gloo_bench
  g++ -O2 -std=c++20 -pthread "$REPO/bench/compare/gloo_bench.cc" \
    -o "$GLOO_BENCH" -lgloo
else
  echo "note: libgloo-dev is not installed; the bundle has no gloo_bench" >&2
fi

find_binary() {
  local path
  path=$(find "$BUILD" -type f -name "$1" -perm -u+x -print -quit)
  if [[ -z "$path" ]]; then
    echo "error: $1 not found under $BUILD" >&2
    exit 1
  fi
  echo "$path"
}

rm -rf "$BUNDLE/bin" "$BUNDLE/lib" "$BUNDLE/glibc" "$BUNDLE/certs" \
  "$BUNDLE/MANIFEST.txt"
mkdir -p "$BUNDLE/bin" "$BUNDLE/lib" "$BUNDLE/glibc"
# Throwaway TLS certificates for `halkactl bench --tls --tls_dir` there
# (the GPU machine may lack the openssl tool); valid for 30 days.
if command -v openssl >/dev/null; then
  HALKA_CERT_DAYS=30 bash "$REPO/scripts/certs.sh" "$BUNDLE/certs" >/dev/null
else
  echo "note: no openssl here; the bundle has no certs/ (run_on_host.sh skips TLS)" >&2
fi

# glibc's own libraries: they must come from one glibc, so they are either
# all the GPU machine's or all ours (bundle/glibc, with our loader).
is_glibc() {
  case "$1" in
    ld-linux*|libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|\
    libresolv.so.*|libutil.so.*|libmvec.so.*|libanl.so.*) return 0 ;;
  esac
  return 1
}
# The driver's libraries come from the GPU machine, never from here.
is_driver() {
  case "$1" in
    libcuda.so*|libnvidia*|libcudadebugger*) return 0 ;;
  esac
  return 1
}

for target in "${TARGETS[@]}" ${GLOO_BENCH:+gloo_bench}; do
  if [[ $target == gloo_bench ]]; then
    src=$GLOO_BENCH
  else
    src=$(find_binary "$target")
  fi
  cp "$src" "$BUNDLE/bin/$target"
  if command -v strip >/dev/null; then strip --strip-debug "$BUNDLE/bin/$target"; fi
  # "name => /path (addr)" lines, and the loader's "/path (addr)" line.
  while read -r name arrow path _; do
    if [[ "$arrow" != "=>" ]]; then  # the loader itself
      path=$name
      name=$(basename "$name")
    fi
    [[ -z "$path" || "$path" == "not" || ! -e "$path" ]] && continue
    if is_driver "$name"; then continue; fi
    if is_glibc "$name"; then
      cp -L "$path" "$BUNDLE/glibc/$name"
    else
      cp -L "$path" "$BUNDLE/lib/$name"
    fi
  done < <(ldd "$src" | grep -v 'linux-vdso')
  if command -v patchelf >/dev/null; then
    patchelf --set-rpath '$ORIGIN/../lib' "$BUNDLE/bin/$target"
  fi
done
# glibc pieces that ldd does not list but programs may dlopen.
for extra in libpthread.so.0 libdl.so.2 librt.so.1; do
  for dir in /lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu /lib64; do
    if [[ -e "$dir/$extra" && ! -e "$BUNDLE/glibc/$extra" ]]; then
      cp -L "$dir/$extra" "$BUNDLE/glibc/$extra"
    fi
  done
done

{
  echo "halka CUDA reducer bundle"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n) ($(. /etc/os-release && echo "$PRETTY_NAME"))"
  echo "build dir: $BUILD"
  echo "glibc: $(ldd --version | head -1)"
  echo "nvcc: $NVCC ($("$NVCC" --version | tail -1))"
  echo "c++: $(grep '^CMAKE_CXX_COMPILER:' "$BUILD/CMakeCache.txt" | cut -d= -f2)"
  echo "build type: $(grep '^CMAKE_BUILD_TYPE:' "$BUILD/CMakeCache.txt" | cut -d= -f2)"
  echo
  (cd "$BUNDLE" && find bin lib glibc $([[ -d certs ]] && echo certs) -type f \
     -printf '%10s  %p\n' | sort -k2)
} >"$BUNDLE/MANIFEST.txt"

echo "bundle: $BUNDLE ($(du -sh "$BUNDLE" | cut -f1))"
cat "$BUNDLE/MANIFEST.txt"
