// Applying a received payload to memory.
#ifndef HALKA_WORKER_CORE_PAYLOAD_H_
#define HALKA_WORKER_CORE_PAYLOAD_H_

#include <cstdint>

#include "worker/core/dtype.h"
#include "worker/core/frame.h"

namespace halka {

// Reduces (reduce=true: dst = dst op payload) or copies the payload of
// `frame` into `dst`. The payload may be split across pieces at any byte
// boundary, even inside an element. The caller has checked its size.
void ApplyPayload(DType dtype, ReduceOp op, bool reduce, uint8_t* dst,
                  const InFrame& frame);

}  // namespace halka

#endif  // HALKA_WORKER_CORE_PAYLOAD_H_
