// The wire links' record format, as both ends of a connection use it
// (transport/tcp/wire_link.cc writes records, transport/tcp/wire_receiver.cc reads them;
// the format itself is described in transport/tcp/wire_link.h). Internal.
#ifndef HALKA_TRANSPORT_TCP_WIRE_RECORD_H_
#define HALKA_TRANSPORT_TCP_WIRE_RECORD_H_

#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
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

}  // namespace halka::wire_record

#endif  // HALKA_TRANSPORT_TCP_WIRE_RECORD_H_
