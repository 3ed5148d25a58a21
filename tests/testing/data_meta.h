// The metadata of a data frame, for tests that make frames by hand: the
// fields every data chunk has; a test sets the rest (segment, offset,
// sender) itself.
#ifndef HALKA_TESTS_TESTING_DATA_META_H_
#define HALKA_TESTS_TESTING_DATA_META_H_

#include <cstdint>

#include "core/frame.h"

namespace halka::testing {

// Chunk `step` of `phase` in operation `op_seq` of `generation`: `count`
// float32 elements, summed.
inline FrameMeta DataChunkMeta(uint64_t generation, uint64_t op_seq,
                               Phase phase, int step, uint64_t count) {
  FrameMeta m;
  m.kind = FrameKind::kData;
  m.generation = generation;
  m.op_seq = op_seq;
  m.phase = phase;
  m.step = step;
  m.count = count;
  m.dtype = DType::kFloat32;
  m.op = ReduceOp::kSum;
  return m;
}

}  // namespace halka::testing

#endif  // HALKA_TESTS_TESTING_DATA_META_H_
