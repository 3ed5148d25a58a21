#!/usr/bin/env bash
# The CUDA reducers' PTX must not store a byte straight from a 16-bit
# register. On an H200 (commit af6d447) such stores, right after a
# float16/bfloat16 rounding (cvt.rn.f16.f32 into %rs), wrote the half's
# numeric value saturated to 0..255 instead of its low byte; the kernels now
# take every stored byte from a 32-bit integer (prmt). Runs without a GPU.
#   ptx_byte_stores_test.sh PTX_FILE
set -euo pipefail
ptx=${1:?usage: ptx_byte_stores_test.sh PTX_FILE}
[[ -s $ptx ]] || { echo "FAIL: no PTX at $ptx"; exit 1; }
stores=$(grep -cE '^\s*st(\.global)?\.u8\s' "$ptx" || true)
# The byte-wise kernels of both 2-byte float types must be there, or the
# check below proves nothing.
for codec in HalfCodec BFloat16Codec; do
  if ! grep -qE "BytewiseKernel.*${codec}" "$ptx"; then
    echo "FAIL: no byte-wise ${codec} kernel in $ptx"; exit 1
  fi
done
if (( stores == 0 )); then
  echo "FAIL: no byte stores at all in $ptx (byte-wise kernels gone?)"; exit 1
fi
bad=$(grep -nE '^\s*st(\.global)?\.u8\s+\[[^]]*\],\s*%rs[0-9]+;' "$ptx" || true)
if [[ -n $bad ]]; then
  echo "FAIL: byte stores from 16-bit registers:"
  echo "$bad" | head -20
  exit 1
fi
echo "ok: $stores byte stores, none from a 16-bit register"
