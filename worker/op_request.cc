#include "worker/op_request.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "worker/core/dtype.h"

namespace halka {

absl::StatusOr<uint64_t> ValidateOpSpec(const v1::OpSpec& spec,
                                        uint64_t max_op_bytes) {
  switch (spec.kind()) {
    case v1::BARRIER:
      return uint64_t{0};
    case v1::ALL_REDUCE:
      if (!IsValidReduceOp(spec.op())) {
        return absl::InvalidArgumentError(
            "all_reduce: the reduce op must be set and valid");
      }
      if (spec.algorithm() < v1::AUTO || spec.algorithm() > v1::PS) {
        return absl::InvalidArgumentError(absl::StrCat(
            "all_reduce: unknown algorithm ", spec.algorithm()));
      }
      break;
    case v1::BROADCAST:
      if (spec.root() < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("broadcast: root ", spec.root(), " is negative"));
      }
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown operation kind ", spec.kind()));
  }
  if (!IsValidDType(spec.dtype())) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid dtype ", spec.dtype()));
  }
  const uint64_t es = DTypeSize(static_cast<DType>(spec.dtype()));
  if (spec.count() > max_op_bytes / es) {
    return absl::ResourceExhaustedError(
        absl::StrCat(spec.count(), " elements exceed this worker's limit of ",
                     max_op_bytes, " bytes per operation"));
  }
  return spec.count() * es;
}

absl::Status ValidateShmName(const std::string& name) {
  if (!absl::StartsWith(name, "/halka-") || name.size() > 200 ||
      name.find('/', 1) != std::string::npos ||
      name.find('\0') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shm name '", name.substr(0, 64), "' is not a halka object (/halka-...)"));
  }
  return absl::OkStatus();
}

absl::Status ValidateShmRegion(const v1::RunRequest& req, uint64_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  if (absl::Status s = ValidateShmName(req.shm_name()); !s.ok()) return s;
  if (req.shm_offset() > req.shm_size() ||
      bytes > req.shm_size() - req.shm_offset()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the region [", req.shm_offset(), ", +", bytes,
        ") lies outside the shm object of ", req.shm_size(), " bytes"));
  }
  return absl::OkStatus();
}

absl::Time CallDeadline(const v1::OpSpec& spec, absl::Time arrived,
                        absl::Duration default_timeout) {
  return arrived + (spec.timeout_ms() > 0 ? absl::Milliseconds(spec.timeout_ms())
                                          : default_timeout);
}

}  // namespace halka
