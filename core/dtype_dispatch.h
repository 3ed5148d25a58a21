// One switch from a DType to the codec that reads and writes its elements,
// shared by the CPU reducer (core/reduce.cc) and the CUDA one
// (core/cuda/cuda_reduce.cu), which each define their own codecs:
//
//   struct Codecs {
//     template <typename T> using Native = NativeCodec<T>;  // T as stored
//     using Half = HalfCodec;          // float16, computed in float
//     using BFloat16 = BFloat16Codec;  // bfloat16, computed in float
//     using Bool = BoolCodec;          // one byte, 0 or 1
//   };
//   WithCodec<Codecs>(dtype, [&](auto tag) {
//     using Codec = typename decltype(tag)::type;
//     ...
//   });
//
// Header-only, no dependencies beyond halka/types.h; compiles as CUDA too.
#ifndef HALKA_CORE_DTYPE_DISPATCH_H_
#define HALKA_CORE_DTYPE_DISPATCH_H_

#include <cstdint>

#include "halka/types.h"

namespace halka {

template <typename Codec>
struct CodecTag {
  using type = Codec;
};

// Calls fn(CodecTag<codec of dtype>{}); nothing for a value outside the
// enum (callers validate wire values with IsValidDType first).
template <typename Codecs, typename Fn>
void WithCodec(DType dtype, Fn&& fn) {
  using C = Codecs;
  switch (dtype) {
    case DType::kFloat32: return fn(CodecTag<typename C::template Native<float>>{});
    case DType::kFloat64: return fn(CodecTag<typename C::template Native<double>>{});
    case DType::kFloat16: return fn(CodecTag<typename C::Half>{});
    case DType::kBFloat16: return fn(CodecTag<typename C::BFloat16>{});
    case DType::kInt32: return fn(CodecTag<typename C::template Native<int32_t>>{});
    case DType::kInt64: return fn(CodecTag<typename C::template Native<int64_t>>{});
    case DType::kInt8: return fn(CodecTag<typename C::template Native<int8_t>>{});
    case DType::kUInt8: return fn(CodecTag<typename C::template Native<uint8_t>>{});
    case DType::kBool: return fn(CodecTag<typename C::Bool>{});
    case DType::kInt16: return fn(CodecTag<typename C::template Native<int16_t>>{});
  }
}

}  // namespace halka

#endif  // HALKA_CORE_DTYPE_DISPATCH_H_
