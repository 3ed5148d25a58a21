// halka's public vocabulary: element types, reduction operators, collective
// kinds and algorithms, job states, the 16-bit float element types of the
// SDK's spans, and the default deadline of one operation.
//
// Shared by the SDK (client/include/halka/client.h) and the engine
// (core/dtype.h, core/frame.h), which adds names, parsing and
// sizes on top. Header-only (target halka::types); needs nothing but Abseil,
// so a public header can include it without pulling in any engine code.
//
// The numeric values match the enums in proto/halka/v1/common.proto, so
// converting between the wire and the engine is a cast after validation.
// Never renumber them.
#ifndef HALKA_COMMON_INCLUDE_HALKA_TYPES_H_
#define HALKA_COMMON_INCLUDE_HALKA_TYPES_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace halka {

enum class DType : uint8_t {
  kFloat32 = 1,
  kFloat64 = 2,
  kFloat16 = 3,
  kBFloat16 = 4,
  kInt32 = 5,
  kInt64 = 6,
  kInt8 = 7,
  kUInt8 = 8,
  // One byte, 0 or 1 (as torch.bool and NumPy's bool_ store it): SUM and
  // MAX are a logical or, PROD and MIN a logical and; AVG is refused.
  kBool = 9,
  kInt16 = 10,
};
inline constexpr DType kAllDTypes[] = {
    DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16,
    DType::kInt32,   DType::kInt64,   DType::kInt8,    DType::kUInt8,
    DType::kBool,    DType::kInt16};

enum class ReduceOp : uint8_t {
  kSum = 1,
  kAvg = 2,
  kMin = 3,
  kMax = 4,
  kProd = 5,
};
inline constexpr ReduceOp kAllReduceOps[] = {ReduceOp::kSum, ReduceOp::kAvg,
                                             ReduceOp::kMin, ReduceOp::kMax,
                                             ReduceOp::kProd};

// The collective an operation runs. Values match halka.v1.OpKind.
enum class OpKind : uint8_t {
  kAllReduce = 1,
  kBroadcast = 2,
  kBarrier = 3,
  kAllGather = 4,
  kReduceScatter = 5,
  kSend = 6,  // point to point: not a collective, takes no number
  kRecv = 7,
  kReduce = 8,    // to one root
  kGather = 9,    // to one root, slice r from rank r
  kScatter = 10,  // from one root, its slice r to rank r
  kAllToAll = 11, // slice k of rank r to slice r of rank k
};

// How a collective moves data. Values match halka.v1.Algorithm.
enum class Algorithm : uint8_t {
  kAuto = 0,   // up to CommConfig::eager_bytes recursive doubling
               // (G <= 16) or tree (G > 16), else two-level
               // (TwoLevelUsable), recursive doubling up to
               // CommConfig::doubling_bytes (G <= 16; not two ranks on
               // one host), halving-doubling up to
               // CommConfig::halving_bytes (G = 4 or 8), or ring
  kRing = 1,
  kNaive = 2,
  kParameterServer = 3,
  kTwoLevel = 4,  // per host, then across hosts, then per host (ring.cc)
  kTree = 5,      // to the host's leader, a binary tree of leaders (tree.cc)
  kRecursiveDoubling = 6,  // log2 G whole-buffer swaps (doubling.cc)
  kHalvingDoubling = 7,    // reduce-scatter by halving, all-gather by
                           // doubling: 2 log2 G steps (halving.cc)
};

// A job's membership state. Values match halka.v1.JobState (the
// rendezvous's state and the SDK's RingHealth use it).
enum class JobState {
  kUnspecified = 0,
  kForming = 1,   // never formed
  kHealthy = 2,   // running with max members
  kDegraded = 3,  // running with fewer than max, at least min
  kWaiting = 4,   // below min: operations fail until enough members (re)join
};

// "forming", "healthy", "degraded", "waiting"; "unspecified" for 0 or a
// value this build does not know.
constexpr const char* JobStateName(JobState state) {
  switch (state) {
    case JobState::kForming:
      return "forming";
    case JobState::kHealthy:
      return "healthy";
    case JobState::kDegraded:
      return "degraded";
    case JobState::kWaiting:
      return "waiting";
    default:
      return "unspecified";
  }
}

// One host of a ring and its ranks, ascending (halka.v1.HostGroup): the
// ring passes them one after the other (the rendezvous's state and the
// SDK's RingHealth use it).
struct HostGroup {
  std::string host;
  std::vector<int> ranks;
};

// 16-bit float element types for spans (bit patterns; no arithmetic).
struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

// The deadline of one operation when its caller names none: the SDK's call
// deadline, halkactl's --timeout and LocalCluster's op_timeout start here.
inline constexpr absl::Duration kDefaultOpTimeout = absl::Seconds(60);

// Tensors streamed through Worker.RunInline travel in messages of at most
// this many bytes, both ways (the SDK's uploads, the worker's replies).
inline constexpr size_t kInlineChunkBytes = size_t{1} << 20;

}  // namespace halka

#endif  // HALKA_COMMON_INCLUDE_HALKA_TYPES_H_
