#include "core/payload.h"

#include <algorithm>
#include <cstring>

#include "core/reduce.h"

namespace halka {

void CopyPayloadBytes(const InFrame& frame, size_t from, size_t n,
                      uint8_t* dst) {
  CopyPieceBytes(frame.pieces, from, n, dst);
}

void CopyPieceBytes(absl::Span<const absl::Span<const uint8_t>> pieces,
                    size_t from, size_t n, uint8_t* dst) {
  for (const auto& piece : pieces) {
    if (n == 0) return;
    if (from >= piece.size()) {
      from -= piece.size();
      continue;
    }
    const size_t take = std::min(n, piece.size() - from);
    std::memcpy(dst, piece.data() + from, take);
    dst += take;
    n -= take;
    from = 0;
  }
}

void ApplyPayload(DType dtype, ReduceOp op, bool reduce, uint8_t* dst,
                  const InFrame& frame) {
  const size_t es = DTypeSize(dtype);
  auto apply = [&](const uint8_t* src, size_t n) {
    if (n == 0) return;
    if (reduce) {
      ReduceInto(dtype, op, dst, src, n);
    } else {
      std::memcpy(dst, src, n * es);
    }
    dst += n * es;
  };
  uint8_t carry[16];
  size_t carry_n = 0;
  for (const auto& piece : frame.pieces) {
    const uint8_t* p = piece.data();
    size_t n = piece.size();
    if (carry_n > 0) {
      const size_t take = std::min(es - carry_n, n);
      std::memcpy(carry + carry_n, p, take);
      carry_n += take;
      p += take;
      n -= take;
      if (carry_n == es) {
        apply(carry, 1);
        carry_n = 0;
      }
    }
    const size_t whole = n / es;
    apply(p, whole);
    p += whole * es;
    n -= whole * es;
    if (n > 0) {
      std::memcpy(carry, p, n);
      carry_n = n;
    }
  }
}

}  // namespace halka
