#include "core/frame.h"

#include <memory>
#include <string>

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
    case OpKind::kAllGather:
      return "all_gather";
    case OpKind::kReduceScatter:
      return "reduce_scatter";
    case OpKind::kSend:
      return "send";
    case OpKind::kRecv:
      return "recv";
    case OpKind::kReduce:
      return "reduce";
    case OpKind::kGather:
      return "gather";
    case OpKind::kScatter:
      return "scatter";
    case OpKind::kAllToAll:
      return "all_to_all";
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
    case Phase::kNaive:
      return "naive exchange";
    case Phase::kPsPush:
      return "ps push";
    case Phase::kPsPull:
      return "ps pull";
    case Phase::kGather:
      return "gather";
    case Phase::kScatter:
      return "scatter";
    case Phase::kAllToAll:
      return "all-to-all";
  }
  return "unknown-phase";
}

absl::string_view AlgorithmName(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::kAuto:
      return "auto";
    case Algorithm::kRing:
      return "ring";
    case Algorithm::kNaive:
      return "naive";
    case Algorithm::kParameterServer:
      return "ps";
    case Algorithm::kTwoLevel:
      return "two_level";
    case Algorithm::kTree:
      return "tree";
    case Algorithm::kRecursiveDoubling:
      return "recursive_doubling";
    case Algorithm::kHalvingDoubling:
      return "halving_doubling";
  }
  return "unknown";
}

absl::StatusOr<Algorithm> ParseAlgorithm(absl::string_view name) {
  for (Algorithm a : {Algorithm::kAuto, Algorithm::kRing, Algorithm::kNaive,
                      Algorithm::kParameterServer, Algorithm::kTwoLevel,
                      Algorithm::kTree, Algorithm::kRecursiveDoubling,
                      Algorithm::kHalvingDoubling}) {
    if (name == AlgorithmName(a)) return a;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown algorithm '", name,
                   "' (expected auto, ring, naive, ps, two_level, tree, "
                   "recursive_doubling or halving_doubling)"));
}

std::string Fingerprint::ToString() const {
  std::string s = absl::StrCat(OpKindName(kind), " #", op_seq);
  switch (kind) {
    case OpKind::kAllReduce:
    case OpKind::kReduceScatter:
    case OpKind::kAllGather:
      absl::StrAppend(&s, " ", DTypeName(dtype), "x", count);
      if (kind != OpKind::kAllGather) absl::StrAppend(&s, " ", ReduceOpName(op));
      if (algorithm != Algorithm::kAuto) {
        absl::StrAppend(&s, " (", AlgorithmName(algorithm), ")");
      }
      break;
    case OpKind::kBroadcast:
    case OpKind::kGather:
    case OpKind::kScatter:
      absl::StrAppend(&s, " ", DTypeName(dtype), "x", count, " root ", root);
      break;
    case OpKind::kReduce:
      absl::StrAppend(&s, " ", DTypeName(dtype), "x", count, " ",
                      ReduceOpName(op), " root ", root);
      if (algorithm != Algorithm::kAuto) {
        absl::StrAppend(&s, " (", AlgorithmName(algorithm), ")");
      }
      break;
    case OpKind::kAllToAll:
      absl::StrAppend(&s, " ", DTypeName(dtype), "x", count);
      break;
    case OpKind::kBarrier:
    case OpKind::kSend:
    case OpKind::kRecv:
      break;
  }
  return s;
}

void ReleaseOnce(std::function<void()>& on_released) {
  if (on_released) {
    std::function<void()> fn = std::move(on_released);
    on_released = nullptr;
    fn();
  }
}

std::function<void()> DetachPayload(OutFrame& frame) {
  if (!frame.on_released) return nullptr;  // owns its bytes already
  auto owned = std::make_shared<std::string>();
  owned->reserve(frame.Bytes());
  for (const auto& p : frame.parts) {
    owned->append(reinterpret_cast<const char*>(p.data()), p.size());
  }
  frame.parts.assign(1, absl::MakeConstSpan(
                            reinterpret_cast<const uint8_t*>(owned->data()),
                            owned->size()));
  frame.keepalive = std::move(owned);
  std::function<void()> release = std::move(frame.on_released);
  frame.on_released = nullptr;
  return release;
}

}  // namespace halka
