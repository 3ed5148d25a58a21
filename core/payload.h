// Applying a received payload to memory.
#ifndef HALKA_CORE_PAYLOAD_H_
#define HALKA_CORE_PAYLOAD_H_

#include <cstdint>

#include "core/dtype.h"
#include "core/frame.h"

namespace halka {

// Copies bytes [from, from + n) of the frame's payload (its pieces back to
// back) to dst; stops early if the payload is shorter.
void CopyPayloadBytes(const InFrame& frame, size_t from, size_t n,
                      uint8_t* dst);
// The same over any bytes in pieces, read back to back.
void CopyPieceBytes(absl::Span<const absl::Span<const uint8_t>> pieces,
                    size_t from, size_t n, uint8_t* dst);

// Reduces (reduce=true: dst = dst op payload) or copies the payload of
// `frame` into `dst`. The payload may be split across pieces at any byte
// boundary, even inside an element. The caller has checked its size.
void ApplyPayload(DType dtype, ReduceOp op, bool reduce, uint8_t* dst,
                  const InFrame& frame);

}  // namespace halka

#endif  // HALKA_CORE_PAYLOAD_H_
