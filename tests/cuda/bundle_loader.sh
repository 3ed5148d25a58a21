# Sourced by tests/cuda/run_on_gpu.sh and bench/compare/run_on_host.sh: how
# to start the bundle's binaries (tests/cuda/make_gpu_bundle.sh) on a
# machine that has none of their libraries.
#
#   bundle_loader BUNDLE TIMEOUT LOG PROBE [ARGS...]
#
# Sets RUN (an array to put before a bundled binary) and LOADER_MODE. First
# the machine's own glibc with bundle/lib on LD_LIBRARY_PATH; if PROBE
# ARGS does not exit 0 that way within TIMEOUT seconds (or
# HALKA_BUNDLED_GLIBC=1), the bundled loader and glibc, with the NVIDIA
# driver's libcuda directory from this machine. Returns non-zero when the
# probe fails both ways; its stderr is in LOG.
bundle_loader() {
  local bundle=$1 t=$2 log=$3
  shift 3
  RUN=(env "LD_LIBRARY_PATH=$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
  LOADER_MODE="system glibc"
  if [[ "${HALKA_BUNDLED_GLIBC:-0}" != 1 ]] &&
     timeout "$t" "${RUN[@]}" "$@" >/dev/null 2>"$log"; then
    return 0
  fi
  echo "the binaries do not start with this machine's glibc (or HALKA_BUNDLED_GLIBC=1):"
  cat "$log" 2>/dev/null
  # The driver's libcuda.so.1, wherever this machine keeps it.
  local cuda_dirs
  cuda_dirs=$( (ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1/ {print $NF}';
                ls /usr/local/nvidia/lib64/libcuda.so.1 /usr/lib64/libcuda.so.1 \
                   /usr/lib/x86_64-linux-gnu/libcuda.so.1 2>/dev/null) |
               xargs -r -n1 dirname | sort -u | paste -sd: -)
  RUN=("$bundle/glibc/ld-linux-x86-64.so.2" --library-path
       "$bundle/lib:$bundle/glibc${cuda_dirs:+:$cuda_dirs}")
  LOADER_MODE="bundled glibc"
  timeout "$t" "${RUN[@]}" "$@" >/dev/null 2>>"$log"
}
