#include "worker/op_request.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/dtype.h"

namespace halka {

uint64_t BufferCount(const v1::OpSpec& spec) {
  switch (spec.kind()) {
    case v1::BARRIER:
      return 0;
    case v1::ALL_GATHER:
    case v1::REDUCE_SCATTER:
    case v1::GATHER:
    case v1::SCATTER:
      return std::max(spec.count(), spec.recv_count());
    default:
      return spec.count();
  }
}

absl::StatusOr<uint64_t> ValidateOpSpec(const v1::OpSpec& spec,
                                        uint64_t max_op_bytes) {
  // "all_reduce", "gather", ... (the proto's names, as the engine's read).
  std::string name = absl::AsciiStrToLower(v1::OpKind_Name(spec.kind()));
  if (name.empty()) name = "operation";
  if (spec.group_ranks_size() > 0) {
    if (spec.kind() == v1::SEND || spec.kind() == v1::RECV) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, " names job ranks: it takes no group (group_ranks)"));
    }
    if (spec.group_ranks_size() > kMaxGroupRanks) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": a group of ", spec.group_ranks_size(),
          " ranks, more than ", kMaxGroupRanks));
    }
  }
  switch (spec.kind()) {
    case v1::BARRIER:
      return uint64_t{0};
    case v1::REDUCE:
    case v1::GATHER:
    case v1::SCATTER:
      if (spec.root() < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, ": root ", spec.root(), " is negative"));
      }
      if (spec.kind() != v1::REDUCE) {
        if (spec.algorithm() < v1::AUTO ||
            spec.algorithm() > v1::Algorithm_MAX) {
          return absl::InvalidArgumentError(
              absl::StrCat(name, ": unknown algorithm ", spec.algorithm()));
        }
        break;
      }
      [[fallthrough]];
    case v1::ALL_REDUCE:
    case v1::REDUCE_SCATTER:
      if (!IsValidReduceOp(spec.op())) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, ": the reduce op must be set and valid"));
      }
      [[fallthrough]];
    case v1::ALL_TO_ALL:
      if (spec.kind() == v1::ALL_TO_ALL && spec.recv_count() != 0 &&
          spec.recv_count() != spec.count()) {
        return absl::InvalidArgumentError(absl::StrCat(
            name, ": recv_count ", spec.recv_count(),
            " must equal count ", spec.count(), " (or be 0)"));
      }
      [[fallthrough]];
    case v1::ALL_GATHER:
      // Whether the counts fit the ring's world is the communicator's to
      // say (it knows the world); here only the buffer's size is bounded.
      if (spec.algorithm() < v1::AUTO || spec.algorithm() > v1::Algorithm_MAX) {
        return absl::InvalidArgumentError(
            absl::StrCat(name, ": unknown algorithm ", spec.algorithm()));
      }
      break;
    case v1::SEND:
    case v1::RECV:
      // Whether the peer is in the ring is the communicator's to say.
      if (spec.peer() < (spec.kind() == v1::RECV ? -1 : 0)) {
        return absl::InvalidArgumentError(absl::StrCat(
            spec.kind() == v1::SEND ? "send" : "recv", ": peer rank ",
            spec.peer(), " is negative",
            spec.kind() == v1::RECV ? " (-1: any rank)" : ""));
      }
      break;
    case v1::BROADCAST:
      if (spec.root() < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("broadcast: root ", spec.root(), " is negative"));
      }
      if (spec.algorithm() < v1::AUTO || spec.algorithm() > v1::Algorithm_MAX) {
        return absl::InvalidArgumentError(
            absl::StrCat("broadcast: unknown algorithm ", spec.algorithm()));
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
  if (spec.kind() == v1::ALL_REDUCE || spec.kind() == v1::REDUCE_SCATTER ||
      spec.kind() == v1::REDUCE) {
    absl::Status s = CheckReduction(static_cast<DType>(spec.dtype()),
                                    static_cast<ReduceOp>(spec.op()));
    if (!s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": ", s.message()));
    }
  }
  const uint64_t es = DTypeSize(static_cast<DType>(spec.dtype()));
  const uint64_t count = BufferCount(spec);
  if (count > max_op_bytes / es) {
    return absl::ResourceExhaustedError(
        absl::StrCat(count, " elements exceed this worker's limit of ",
                     max_op_bytes, " bytes per operation"));
  }
  return count * es;
}

bool IsPointToPoint(const v1::OpSpec& spec) {
  return spec.kind() == v1::SEND || spec.kind() == v1::RECV;
}

bool IsGroupOp(const v1::OpSpec& spec) {
  return spec.group_ranks_size() > 0 && !IsPointToPoint(spec);
}

uint64_t InlineUploadBytes(const v1::OpSpec& spec, uint64_t buffer_bytes) {
  if (spec.kind() == v1::RECV) return 0;
  if (spec.kind() != v1::ALL_GATHER && spec.kind() != v1::GATHER) {
    return buffer_bytes;
  }
  return spec.count() * DTypeSize(static_cast<DType>(spec.dtype()));
}

bool InlineUploadMayBeEmpty(const v1::OpSpec& spec) {
  return spec.kind() == v1::SCATTER;
}

ByteRange InlineReplyRange(const v1::OpSpec& spec, int rank,
                           uint64_t buffer_bytes) {
  if (spec.kind() == v1::SEND) return ByteRange{0, 0};
  if (spec.kind() == v1::REDUCE || spec.kind() == v1::GATHER) {
    return rank == spec.root() ? ByteRange{0, buffer_bytes} : ByteRange{0, 0};
  }
  if (spec.kind() != v1::REDUCE_SCATTER && spec.kind() != v1::SCATTER) {
    return ByteRange{0, buffer_bytes};
  }
  const uint64_t slice =
      spec.recv_count() * DTypeSize(static_cast<DType>(spec.dtype()));
  const uint64_t offset = static_cast<uint64_t>(rank) * slice;
  if (rank < 0 || offset > buffer_bytes || slice > buffer_bytes - offset) {
    return ByteRange{0, 0};
  }
  return ByteRange{offset, slice};
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
