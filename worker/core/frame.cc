#include "worker/core/frame.h"

#include "absl/strings/str_cat.h"

namespace halka {

absl::string_view OpKindName(OpKind kind) {
  switch (kind) {
    case OpKind::kAllReduce:
      return "all_reduce";
    case OpKind::kBroadcast:
      return "broadcast";
    case OpKind::kBarrier:
      return "barrier";
  }
  return "unknown_op";
}

absl::string_view PhaseName(Phase phase) {
  switch (phase) {
    case Phase::kFingerprint:
      return "fingerprint";
    case Phase::kReduceScatter:
      return "reduce-scatter";
    case Phase::kAllGather:
      return "all-gather";
    case Phase::kBroadcast:
      return "broadcast";
  }
  return "unknown-phase";
}

std::string Fingerprint::ToString() const {
  std::string s = absl::StrCat(OpKindName(kind), " #", op_seq);
  switch (kind) {
    case OpKind::kAllReduce:
      absl::StrAppend(&s, " ", DTypeName(dtype), "x", count, " ",
                      ReduceOpName(op));
      break;
    case OpKind::kBroadcast:
      absl::StrAppend(&s, " ", DTypeName(dtype), "x", count, " root ", root);
      break;
    case OpKind::kBarrier:
      break;
  }
  return s;
}

}  // namespace halka
