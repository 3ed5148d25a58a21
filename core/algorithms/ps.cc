// Parameter-server all-reduce: push shards, pull the reduced shards back.
#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/algorithms/algorithms.h"
#include "core/ring_plan.h"
#include "core/status_macros.h"

namespace halka {

absl::Status PsAllReduce(OpContext& op) {
  const int g = op.world();
  const int k_servers = op.servers();
  if (k_servers == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        op.Where(), ": no parameter server is known for this job"));
  }
  const Fingerprint& fp = op.fp();
  const size_t es = DTypeSize(fp.dtype);
  OpBuffer& buf = op.buffer();
  const size_t chunk_elems =
      std::max<size_t>(1, op.config().chunk_bytes / es);
  const std::vector<Range> shards = PlanSegments(fp.count, k_servers);
  std::vector<std::vector<Range>> chunks;
  size_t total_chunks = 0;
  for (const Range& s : shards) {
    chunks.push_back(PlanChunks(s, chunk_elems));
    total_chunks += chunks.back().size();
  }
  op.TrackSegments(std::max<size_t>(total_chunks, 1));
  const FrameMeta fpm = op.FingerprintMeta();
  // Push every chunk to its shard at once (the wire paces it), then take
  // the results back in order.
  size_t idx = 0;
  for (int k = 0; k < k_servers; ++k) {
    HALKA_RETURN_IF_ERROR(op.Send(g + k, fpm, nullptr, 0, -1));
    for (const Range& c : chunks[static_cast<size_t>(k)]) {
      HALKA_ASSIGN_OR_RETURN(const uint8_t* p,
                             buf.HostView(c.offset, c.count));
      HALKA_RETURN_IF_ERROR(op.Send(g + k,
                                    op.ChunkMeta(Phase::kPsPush, 0, k, c), p,
                                    c.count * es, static_cast<int>(idx++)));
    }
  }
  idx = 0;
  for (int k = 0; k < k_servers; ++k) {
    const auto& cs = chunks[static_cast<size_t>(k)];
    for (size_t ci = 0; ci < cs.size(); ++ci, ++idx) {
      const Range& c = cs[ci];
      op.SetLedger(Phase::kPsPull, k, static_cast<int>(ci),
                   static_cast<int>(cs.size()), g + k);
      HALKA_ASSIGN_OR_RETURN(
          InFrame in,
          op.AwaitData(g + k, op.ChunkMeta(Phase::kPsPull, 0, k, c)));
      if (!op.WaitForReleases(static_cast<int>(idx), op.deadline())) {
        return absl::DeadlineExceededError(absl::StrCat(
            op.Where(), ": deadline exceeded before ", op.Who(g + k),
            " took this rank's chunk at offset ", c.offset));
      }
      HALKA_RETURN_IF_ERROR(
          buf.Apply(/*reduce=*/false, c.offset, c.count, in));
    }
  }
  return absl::OkStatus();
}

}  // namespace halka
