// CPU reducers: the element-wise kernels every algorithm uses.
//
// Thread-safety: pure functions; callers own the memory.
#ifndef HALKA_CORE_REDUCE_H_
#define HALKA_CORE_REDUCE_H_

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace halka {

// dst[i] = dst[i] (op) src[i] for i in [0, count).
// AVG reduces as SUM here; the owner of a segment divides once with
// FinalizeAvg. Integer SUM and PROD wrap around (two's complement) instead of
// overflowing into undefined behaviour. Floating MIN/MAX propagate NaN.
// float16/bfloat16 compute in float32 and round to nearest even once per
// call. dst and src may not overlap partially (dst == src is allowed).
// Neither pointer needs any alignment.
void ReduceInto(DType dtype, ReduceOp op, void* dst, const void* src,
                size_t count);

// dst[i] = dst[i] / divisor, the last step of AVG. Integers divide with
// truncation toward zero; float16/bfloat16 divide in float32 and round once.
void FinalizeAvg(DType dtype, void* dst, size_t count, int divisor);

// IEEE half and bfloat16 conversions (round to nearest even; NaN stays NaN).
uint16_t FloatToHalf(float value);
float HalfToFloat(uint16_t bits);
uint16_t FloatToBFloat16(float value);
float BFloat16ToFloat(uint16_t bits);

}  // namespace halka

#endif  // HALKA_CORE_REDUCE_H_
