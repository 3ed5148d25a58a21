// Frames for codec tests: a gRPC buffer as one string, and a fingerprint
// and an ABORT with every field set.
#ifndef HALKA_TESTS_TESTING_FRAME_SAMPLES_H_
#define HALKA_TESTS_TESTING_FRAME_SAMPLES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/frame.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "gtest/gtest.h"

namespace halka::testing {

// The buffer's bytes, its slices joined.
inline std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

// A fingerprint frame's metadata: `count` elements of `dtype` (its payload,
// if any), a broadcast's fingerprint with every field set.
inline FrameMeta FingerprintMeta(uint64_t count, DType dtype) {
  FrameMeta m;
  m.kind = FrameKind::kFingerprint;
  m.generation = 4;
  m.op_seq = 77;
  m.phase = Phase::kFingerprint;
  m.count = count;
  m.dtype = dtype;
  m.op = ReduceOp::kMax;
  m.fingerprint.op_seq = 77;
  m.fingerprint.kind = OpKind::kBroadcast;
  m.fingerprint.dtype = DType::kInt64;
  m.fingerprint.count = 123456789012ull;
  m.fingerprint.op = ReduceOp::kMax;
  m.fingerprint.root = 3;
  m.fingerprint.algorithm = Algorithm::kParameterServer;
  m.origin_rank = 3;
  m.sender_rank = 1;
  return m;
}

// An ABORT with `code` and `message`, every other field set too.
inline FrameMeta AbortMeta(absl::StatusCode code, const std::string& message) {
  FrameMeta m;
  m.kind = FrameKind::kAbort;
  m.generation = 8;
  m.op_seq = 12;
  m.phase = Phase::kAllGather;
  m.step = 2;
  m.dtype = DType::kFloat64;
  m.op = ReduceOp::kProd;
  m.origin_rank = 6;
  m.sender_rank = 7;
  m.abort_code = code;
  m.message = message;
  return m;
}

}  // namespace halka::testing

#endif  // HALKA_TESTS_TESTING_FRAME_SAMPLES_H_
