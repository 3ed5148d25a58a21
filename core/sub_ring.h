// A group of a job's ranks with collectives of its own (torch's new_group,
// OpSpec.group_ranks): a ring inside the job's ring, not a second job.
//
// A SubRing runs on the job's links and inbox. Its Communicator is an
// ordinary one over the group's ranks (group rank i is job rank ranks[i]),
// with numbering, fingerprints, deadlines and aborts of its own; what
// makes it a group is where its frames go:
//   - out: through the job's transport to the member's job rank, stamped
//     with the group's id (FrameMeta::group) and, on the wire, this
//     worker's job rank as the sender;
//   - in: the job's inbox hands the group's frames to the SubRing's own
//     inbox, as the sender's group rank (Inbox::AttachGroup), holding
//     those that came before the group was attached here;
//   - a failed operation withdraws only the group's frames of that
//     number (OpId), and link failures and interrupts (a membership change,
//     a shutdown) of the job reach the group too.
// A group's frames never land in place (LandingBoard takes the job's
// only), and its counters are its own (not the worker's /metrics).
//
// Thread-safety: as Communicator. The job's transport and inbox must
// outlive the SubRing.
#ifndef HALKA_CORE_SUB_RING_H_
#define HALKA_CORE_SUB_RING_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/communicator.h"
#include "core/transport.h"

namespace halka {

// The id of the group of `ranks` (in the group's order) tagged `tag`
// (OpSpec.group_tag: groups of the same ranks are told apart by it): a
// 64-bit hash of both, never 0. Every member computes the same.
uint64_t GroupId(absl::Span<const int> ranks, uint64_t tag = 0);

class SubRing {
 public:
  // The group of `ranks` (job ranks in the group's order) of the job whose
  // communicator is configured by `job`, on its transport and inbox.
  // INVALID_ARGUMENT (naming the job's world) for an empty list, ranks
  // repeated or outside the job, or a list without job.rank.
  static absl::StatusOr<std::unique_ptr<SubRing>> Attach(
      const CommConfig& job, Transport* transport, Inbox* inbox,
      std::vector<int> ranks, uint64_t tag = 0);
  ~SubRing();  // detaches the group from the job's inbox
  SubRing(const SubRing&) = delete;
  SubRing& operator=(const SubRing&) = delete;

  uint64_t id() const { return id_; }
  uint64_t tag() const { return tag_; }
  const std::vector<int>& ranks() const { return ranks_; }
  Communicator& comm() { return *comm_; }
  // "group [0,2,3]".
  std::string Name() const;

 private:
  class GroupTransport;
  SubRing(uint64_t id, uint64_t tag, std::vector<int> ranks, Inbox* job_inbox);

  const uint64_t id_;
  const uint64_t tag_;
  const std::vector<int> ranks_;
  Inbox* const job_inbox_;
  std::shared_ptr<Inbox> inbox_;
  std::unique_ptr<GroupTransport> transport_;
  std::unique_ptr<Communicator> comm_;
};

}  // namespace halka

#endif  // HALKA_CORE_SUB_RING_H_
