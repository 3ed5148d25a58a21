// The wire links' record format, as both ends of a connection use it
// (transport/tcp/wire_sender.cc writes records, transport/tcp/wire_receiver.cc reads them;
// the format itself is described in transport/tcp/wire_link.h). Internal.
#ifndef HALKA_TRANSPORT_TCP_WIRE_RECORD_H_
#define HALKA_TRANSPORT_TCP_WIRE_RECORD_H_

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "codec/frame_codec.h"

namespace halka::wire_record {

// A record holds one frame: its head and the largest payload.
inline constexpr size_t kMaxRecordBytes =
    4 + kMaxFrameHeaderBytes + kMaxFramePayloadBytes;

inline void PutU32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
inline uint32_t GetU32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}

// Makes an eventfd readable (for good: nobody reads it back).
inline void Signal(int event_fd) {
  const uint64_t one = 1;
  (void)!write(event_fd, &one, sizeof(one));
}

inline std::string Errno(absl::string_view what) {
  return absl::StrCat(what, ": ", std::strerror(errno));
}

// The bytes of a frame's head ([u32 header length][header]) at the start
// of its parts, at most `total` (what the frame codec wrote: its first
// four bytes say).
inline size_t FrameHeadBytes(const std::vector<absl::Span<const uint8_t>>& parts,
                      size_t total) {
  uint8_t len[4] = {0, 0, 0, 0};
  size_t got = 0;
  for (const auto& p : parts) {
    for (size_t i = 0; i < p.size() && got < 4; ++i) len[got++] = p[i];
    if (got == 4) break;
  }
  return got < 4 ? total : std::min<size_t>(total, 4 + size_t{GetU32(len)});
}

// The parts cut at byte `at`: what comes before, and the rest.
inline void SplitParts(const std::vector<absl::Span<const uint8_t>>& parts, size_t at,
                std::vector<absl::Span<const uint8_t>>* before,
                std::vector<absl::Span<const uint8_t>>* after) {
  for (const auto& p : parts) {
    const size_t take = std::min(at, p.size());
    if (take > 0) before->push_back(p.subspan(0, take));
    if (take < p.size()) after->push_back(p.subspan(take));
    at -= take;
  }
}

}  // namespace halka::wire_record

#endif  // HALKA_TRANSPORT_TCP_WIRE_RECORD_H_
