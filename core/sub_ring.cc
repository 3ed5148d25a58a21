#include "core/sub_ring.h"

#include <set>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace halka {

uint64_t GroupId(absl::Span<const int> ranks, uint64_t tag) {
  // FNV-1a over the tag, the list's length and ranks, then a final mix.
  uint64_t h = 0xcbf29ce484222325ull;
  auto mix = [&h](uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 0x100000001b3ull;
    }
  };
  mix(tag);
  mix(ranks.size());
  for (int r : ranks) mix(static_cast<uint32_t>(r));
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h == 0 ? 1 : h;
}

// The job's transport as the group's: group ranks out, the group's id on
// every frame, this worker's job rank as the sender.
class SubRing::GroupTransport : public Transport {
 public:
  GroupTransport(Transport* job, uint64_t id, std::vector<int> ranks,
                 int job_rank)
      : job_(job), id_(id), ranks_(std::move(ranks)), job_rank_(job_rank) {}

  absl::Status Send(int to, const FrameMeta& meta,
                    absl::Span<const uint8_t> payload,
                    std::function<void()> on_released) override {
    if (to < 0 || to >= static_cast<int>(ranks_.size())) {
      if (on_released) on_released();
      return absl::InvalidArgumentError(
          absl::StrCat("send: no rank ", to, " in the group"));
    }
    FrameMeta m = meta;
    m.group = id_;
    m.sender_rank = job_rank_;
    return job_->Send(ranks_[static_cast<size_t>(to)], m, payload,
                      std::move(on_released));
  }
  void Withdraw(const OpId& op) override {
    job_->Withdraw(OpId{op.op_seq, id_});
  }
  void Reset(int to) override {
    if (to >= 0 && to < static_cast<int>(ranks_.size())) {
      job_->Reset(ranks_[static_cast<size_t>(to)]);
    }
  }
  void HoldWrites() override { job_->HoldWrites(); }
  void ReleaseWrites() override { job_->ReleaseWrites(); }

 private:
  Transport* const job_;
  const uint64_t id_;
  const std::vector<int> ranks_;
  const int job_rank_;
};

SubRing::SubRing(uint64_t id, uint64_t tag, std::vector<int> ranks,
                 Inbox* job_inbox)
    : id_(id), tag_(tag), ranks_(std::move(ranks)), job_inbox_(job_inbox) {}

absl::StatusOr<std::unique_ptr<SubRing>> SubRing::Attach(
    const CommConfig& job, Transport* transport, Inbox* inbox,
    std::vector<int> ranks, uint64_t tag) {
  const std::string list = absl::StrCat("[", absl::StrJoin(ranks, ","), "]");
  if (ranks.empty()) {
    return absl::InvalidArgumentError("a group needs at least one rank");
  }
  std::set<int> seen;
  int me = -1;
  for (size_t i = 0; i < ranks.size(); ++i) {
    const int r = ranks[i];
    if (r < 0 || r >= job.world_size || !seen.insert(r).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "group ", list, ": rank ", r, " is ",
          r < 0 || r >= job.world_size ? "not a rank of the job" : "repeated",
          " (the job has ranks 0..", job.world_size - 1, ")"));
    }
    if (r == job.rank) me = static_cast<int>(i);
  }
  if (me < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "group ", list, " does not hold this worker's rank ", job.rank,
        ": only a group's members call its collectives"));
  }
  const uint64_t id = GroupId(ranks, tag);
  std::unique_ptr<SubRing> ring(new SubRing(id, tag, ranks, inbox));
  CommConfig c = job;
  c.rank = me;
  c.world_size = static_cast<int>(ranks.size());
  c.members.clear();
  for (size_t i = 0; i < ranks.size(); ++i) {
    PeerInfo p = job.members[static_cast<size_t>(ranks[i])];
    p.rank = static_cast<int>(i);
    p.worker_id = absl::StrCat(p.worker_id, ", job rank ", ranks[i]);
    c.members.push_back(std::move(p));
  }
  c.ring_order.clear();
  c.hosts.clear();
  c.first_op_seq = 1;
  ring->inbox_ = std::make_shared<Inbox>(c.world_size, inbox->counters());
  ring->inbox_->SetByteBudget(inbox->byte_budget());
  // Its frames come by delivery (the job inbox's taps deliver them), so
  // its waits neither spin nor yield; the job inbox's setting is kept for
  // when they do.
  ring->inbox_->SetSpinBeforeSleep(inbox->spin_before_sleep());
  ring->transport_ =
      std::make_unique<GroupTransport>(transport, id, ranks, job.rank);
  ring->comm_ = std::make_unique<Communicator>(c, ring->transport_.get(),
                                               ring->inbox_.get());
  absl::Status attached = inbox->AttachGroup(id, ranks, ring->inbox_);
  if (!attached.ok()) {
    ring->inbox_.reset();  // not attached: the destructor detaches nothing
    return attached;
  }
  return ring;
}

SubRing::~SubRing() {
  if (inbox_ != nullptr) job_inbox_->DetachGroup(id_);
}

std::string SubRing::Name() const {
  return absl::StrCat("group [", absl::StrJoin(ranks_, ","), "]",
                      tag_ == 0 ? "" : absl::StrCat(" tag ", tag_));
}

}  // namespace halka
