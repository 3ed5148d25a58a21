#include "client/op_spec.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "core/dtype.h"

namespace halka {
namespace {

// The SDK's enums (halka/types.h) are the wire's, value for value: the
// specs below convert with a cast.
static_assert(static_cast<int>(DType::kFloat32) == v1::FLOAT32 &&
              static_cast<int>(DType::kFloat64) == v1::FLOAT64 &&
              static_cast<int>(DType::kFloat16) == v1::FLOAT16 &&
              static_cast<int>(DType::kBFloat16) == v1::BFLOAT16 &&
              static_cast<int>(DType::kInt32) == v1::INT32 &&
              static_cast<int>(DType::kInt64) == v1::INT64 &&
              static_cast<int>(DType::kInt8) == v1::INT8 &&
              static_cast<int>(DType::kUInt8) == v1::UINT8 &&
              static_cast<int>(DType::kBool) == v1::BOOL &&
              static_cast<int>(DType::kInt16) == v1::INT16 &&
              v1::DType_MAX == v1::INT16,
              "halka::DType must match halka.v1.DType");
static_assert(static_cast<int>(ReduceOp::kSum) == v1::SUM &&
              static_cast<int>(ReduceOp::kAvg) == v1::AVG &&
              static_cast<int>(ReduceOp::kMin) == v1::MIN &&
              static_cast<int>(ReduceOp::kMax) == v1::MAX &&
              static_cast<int>(ReduceOp::kProd) == v1::PROD &&
              v1::ReduceOp_MAX == v1::PROD,
              "halka::ReduceOp must match halka.v1.ReduceOp");
static_assert(static_cast<int>(OpKind::kAllReduce) == v1::ALL_REDUCE &&
              static_cast<int>(OpKind::kBroadcast) == v1::BROADCAST &&
              static_cast<int>(OpKind::kBarrier) == v1::BARRIER &&
              static_cast<int>(OpKind::kAllGather) == v1::ALL_GATHER &&
              static_cast<int>(OpKind::kReduceScatter) == v1::REDUCE_SCATTER &&
              static_cast<int>(OpKind::kSend) == v1::SEND &&
              static_cast<int>(OpKind::kRecv) == v1::RECV &&
              static_cast<int>(OpKind::kReduce) == v1::REDUCE &&
              static_cast<int>(OpKind::kGather) == v1::GATHER &&
              static_cast<int>(OpKind::kScatter) == v1::SCATTER &&
              static_cast<int>(OpKind::kAllToAll) == v1::ALL_TO_ALL &&
              v1::OpKind_MAX == v1::ALL_TO_ALL,
              "halka::OpKind must match halka.v1.OpKind");
static_assert(static_cast<int>(Algorithm::kAuto) == v1::AUTO &&
              static_cast<int>(Algorithm::kRing) == v1::RING &&
              static_cast<int>(Algorithm::kNaive) == v1::NAIVE &&
              static_cast<int>(Algorithm::kParameterServer) == v1::PS &&
              static_cast<int>(Algorithm::kTwoLevel) == v1::TWO_LEVEL &&
              static_cast<int>(Algorithm::kTree) == v1::TREE &&
              static_cast<int>(Algorithm::kRecursiveDoubling) ==
                  v1::RECURSIVE_DOUBLING &&
              static_cast<int>(Algorithm::kHalvingDoubling) ==
                  v1::HALVING_DOUBLING &&
              v1::Algorithm_MAX == v1::HALVING_DOUBLING,
              "halka::Algorithm must match halka.v1.Algorithm");

// The operation's deadline (0: the worker's default) and group.
void SetOpOptions(const OpOptions& options, v1::OpSpec* spec) {
  spec->set_timeout_ms(
      static_cast<uint32_t>(absl::ToInt64Milliseconds(options.timeout)));
  for (int r : options.group) spec->add_group_ranks(r);
  if (!options.group.empty()) spec->set_group_tag(options.group_tag);
}

}  // namespace

absl::StatusOr<v1::OpSpec> AllReduceSpec(size_t count, DType dtype,
                                         ReduceOp op,
                                         const OpOptions& options) {
  if (!IsValidDType(static_cast<int>(dtype)) ||
      !IsValidReduceOp(static_cast<int>(op))) {
    return absl::InvalidArgumentError("all_reduce: invalid dtype or op");
  }
  if (absl::Status s = CheckReduction(dtype, op); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("all_reduce: ", s.message()));
  }
  v1::OpSpec spec;
  spec.set_kind(v1::ALL_REDUCE);
  spec.set_dtype(static_cast<v1::DType>(dtype));
  spec.set_count(count);
  spec.set_op(static_cast<v1::ReduceOp>(op));
  spec.set_algorithm(static_cast<v1::Algorithm>(options.algorithm));
  SetOpOptions(options, &spec);
  return spec;
}

absl::StatusOr<v1::OpSpec> SliceSpec(v1::OpKind kind, const void* send,
                                     size_t send_count, const void* recv,
                                     size_t recv_count, DType dtype,
                                     ReduceOp op, const OpOptions& options) {
  const char* name =
      kind == v1::ALL_GATHER ? "all_gather" : "reduce_scatter";
  if (!IsValidDType(static_cast<int>(dtype))) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": invalid dtype"));
  }
  if (kind == v1::REDUCE_SCATTER && !IsValidReduceOp(static_cast<int>(op))) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": invalid reduce op"));
  }
  if (kind == v1::REDUCE_SCATTER) {
    if (absl::Status s = CheckReduction(dtype, op); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": ", s.message()));
    }
  }
  if ((send == nullptr && send_count > 0) ||
      (recv == nullptr && recv_count > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": null send or recv buffer"));
  }
  const size_t limit = std::numeric_limits<size_t>::max() / DTypeSize(dtype);
  if (send_count > limit || recv_count > limit) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": element counts overflow the address space"));
  }
  v1::OpSpec spec;
  spec.set_kind(kind);
  spec.set_dtype(static_cast<v1::DType>(dtype));
  spec.set_count(send_count);
  spec.set_recv_count(recv_count);
  if (kind == v1::REDUCE_SCATTER) spec.set_op(static_cast<v1::ReduceOp>(op));
  spec.set_algorithm(static_cast<v1::Algorithm>(options.algorithm));
  SetOpOptions(options, &spec);
  return spec;
}

absl::StatusOr<v1::OpSpec> RootedSpec(v1::OpKind kind, size_t count,
                                      size_t recv_count, DType dtype,
                                      ReduceOp op, int root,
                                      const OpOptions& options) {
  const char* name = kind == v1::REDUCE    ? "reduce"
                     : kind == v1::GATHER  ? "gather"
                     : kind == v1::SCATTER ? "scatter"
                                           : "all_to_all";
  if (!IsValidDType(static_cast<int>(dtype))) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": invalid dtype"));
  }
  if (kind == v1::REDUCE) {
    if (!IsValidReduceOp(static_cast<int>(op))) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, ": invalid reduce op"));
    }
    if (absl::Status s = CheckReduction(dtype, op); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": ", s.message()));
    }
  }
  if (kind != v1::ALL_TO_ALL && root < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": root ", root, " is negative"));
  }
  const size_t limit = std::numeric_limits<size_t>::max() / DTypeSize(dtype);
  if (count > limit || recv_count > limit) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": element counts overflow the address space"));
  }
  v1::OpSpec spec;
  spec.set_kind(kind);
  spec.set_dtype(static_cast<v1::DType>(dtype));
  spec.set_count(count);
  spec.set_recv_count(recv_count);
  if (kind == v1::REDUCE) spec.set_op(static_cast<v1::ReduceOp>(op));
  if (kind != v1::ALL_TO_ALL) spec.set_root(root);
  spec.set_algorithm(static_cast<v1::Algorithm>(options.algorithm));
  SetOpOptions(options, &spec);
  return spec;
}

absl::StatusOr<v1::OpSpec> BroadcastSpec(size_t count, DType dtype, int root,
                                         const OpOptions& options) {
  if (!IsValidDType(static_cast<int>(dtype))) {
    return absl::InvalidArgumentError("broadcast: invalid dtype");
  }
  v1::OpSpec spec;
  spec.set_kind(v1::BROADCAST);
  spec.set_dtype(static_cast<v1::DType>(dtype));
  spec.set_count(count);
  spec.set_root(root);
  spec.set_algorithm(static_cast<v1::Algorithm>(options.algorithm));
  SetOpOptions(options, &spec);
  return spec;
}

absl::StatusOr<v1::OpSpec> PeerSpec(v1::OpKind kind, size_t count,
                                    DType dtype, int peer, int tag,
                                    const OpOptions& options) {
  const char* name = kind == v1::SEND ? "send" : "recv";
  if (!IsValidDType(static_cast<int>(dtype))) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": invalid dtype"));
  }
  if (peer < (kind == v1::RECV ? -1 : 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, ": peer rank ", peer, " is negative",
        kind == v1::RECV ? " (-1: any rank)" : ""));
  }
  if (!options.group.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        name, " names a job rank: it takes no group (OpOptions::group)"));
  }
  v1::OpSpec spec;
  spec.set_kind(kind);
  spec.set_dtype(static_cast<v1::DType>(dtype));
  spec.set_count(count);
  spec.set_peer(peer);
  spec.set_tag(tag);
  SetOpOptions(options, &spec);
  return spec;
}

v1::OpSpec BarrierSpec(const OpOptions& options) {
  v1::OpSpec spec;
  spec.set_kind(v1::BARRIER);
  SetOpOptions(options, &spec);
  return spec;
}

OpIo SliceIo(const void* send, size_t send_count, void* recv,
             size_t recv_count, DType dtype) {
  const size_t es = DTypeSize(dtype);
  return OpIo{send, send_count * es, recv, recv_count * es,
              std::max(send_count, recv_count) * es};
}

bool InPlaceSlice(const OpIo& io, v1::OpSpec* spec) {
  const uintptr_t send = reinterpret_cast<uintptr_t>(io.send);
  const uintptr_t recv = reinterpret_cast<uintptr_t>(io.recv);
  if (io.send_bytes > 0 && io.send_bytes <= io.recv_bytes && send >= recv &&
      send - recv <= io.recv_bytes - io.send_bytes &&
      (send - recv) % io.send_bytes == 0) {
    spec->set_input_slice((send - recv) / io.send_bytes);
    return true;
  }
  // Otherwise the caller copies it to slice 0, which the result overwrites.
  spec->set_input_slice(0);
  return false;
}

void PlaceContribution(const OpIo& io, v1::OpSpec* spec) {
  if (!InPlaceSlice(io, spec)) std::memmove(io.recv, io.send, io.send_bytes);
}

}  // namespace halka
