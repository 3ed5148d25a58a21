// libFuzzer target: every rendezvous request as a hostile client could send
// it. The input is a sequence of records [kind byte][u16 length][bytes];
// each record's bytes are parsed as that RPC's request proto (as gRPC
// would) and applied to one RendezvousState, whose methods hold the
// validation of every rendezvous handler (the service only copies fields).
// Any crash, sanitizer report or status code outside the documented set
// fails.
#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "halka/v1/rendezvous.pb.h"
#include "server/rendezvous_state.h"

namespace {

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

// The codes the rendezvous documents for request errors.
void CheckCode(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kOk:
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kAborted:
      return;
    default:
      __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  halka::RendezvousOptions options;
  options.max_jobs = 4;
  options.max_world_size = 16;
  halka::RendezvousState state(options);
  absl::Time now = absl::UnixEpoch() + absl::Hours(1);
  size_t pos = 0;
  while (pos + 3 <= size) {
    const uint8_t kind = data[pos];
    const size_t len = static_cast<size_t>(data[pos + 1]) |
                       (static_cast<size_t>(data[pos + 2]) << 8);
    pos += 3;
    const size_t n = len < size - pos ? len : size - pos;
    const void* bytes = data + pos;
    pos += n;
    now += absl::Milliseconds(kind);  // time moves on, sometimes far
    std::string touched;  // the job this record acted on
    switch (kind % 10) {
      case 0: {
        halka::v1::JoinRequest r;
        if (!r.ParseFromArray(bytes, static_cast<int>(n))) break;
        halka::JoinArgs a;
        a.job_id = r.job_id();
        a.worker_id = r.worker_id();
        a.address = r.address();
        a.device = r.device();
        a.world_size = r.world_size();
        a.min_world_size = r.min_world_size();
        a.max_world_size = r.max_world_size();
        a.incarnation = r.incarnation();
        a.requested_rank = r.has_requested_rank() ? r.requested_rank() : -1;
        CheckCode(state.Join(a, now));
        auto as = state.GetAssignment(a.job_id, a.worker_id);
        if (as.has_value()) {
          Check(as->rank >= 0 && as->rank < as->view.world_size);
          Check(static_cast<int>(as->view.members.size()) ==
                as->view.world_size);
        }
        (void)state.DescribeForming(a.job_id);
        touched = a.job_id;
        break;
      }
      case 1: {
        halka::v1::HeartbeatRequest r;
        if (!r.ParseFromArray(bytes, static_cast<int>(n))) break;
        CheckCode(state.Heartbeat(r.job_id(), r.worker_id(),
                                  r.telemetry().SerializeAsString(), now)
                      .status());
        touched = r.job_id();
        break;
      }
      case 2: {
        halka::v1::LeaveRequest r;
        if (!r.ParseFromArray(bytes, static_cast<int>(n))) break;
        CheckCode(state.Leave(r.job_id(), r.worker_id(), now));
        touched = r.job_id();
        break;
      }
      case 3: {
        halka::v1::RingHealthRequest r;
        if (!r.ParseFromArray(bytes, static_cast<int>(n))) break;
        auto h = state.Health(r.job_id(), now);
        CheckCode(h.status());
        break;
      }
      case 4: {
        halka::v1::RegisterServerRequest r;
        if (!r.ParseFromArray(bytes, static_cast<int>(n))) break;
        CheckCode(state.RegisterServer(r.job_id(), r.server_id(), r.address(),
                                       r.shard(), r.shards(), now));
        break;
      }
      case 5: {
        halka::v1::LookupServersRequest r;
        if (!r.ParseFromArray(bytes, static_cast<int>(n))) break;
        CheckCode(state.LookupServers(r.job_id(), now).status());
        break;
      }
      case 6:
        (void)state.Sweep(now + absl::Seconds(kind));
        break;
      case 7: {  // a heartbeat that carries a claim (after a restart)
        halka::v1::HeartbeatRequest r;
        if (!r.ParseFromArray(bytes, static_cast<int>(n))) break;
        halka::RingClaim c;
        c.generation = r.claim().generation();
        c.min_world_size = r.claim().min_world_size();
        c.max_world_size = r.claim().max_world_size();
        for (const halka::v1::Member& m : r.claim().members()) {
          halka::MemberView v;
          v.rank = m.rank();
          v.worker_id = m.worker_id();
          v.address = m.address();
          v.since_generation = m.since_generation();
          c.members.push_back(v);
        }
        CheckCode(state.Restore(r.job_id(), c, now));
        touched = r.job_id();
        break;
      }
      case 8: {
        halka::v1::ReportFailureRequest r;
        if (!r.ParseFromArray(bytes, static_cast<int>(n))) break;
        CheckCode(state.DeclareLost(r.job_id(), r.suspect_worker_id(),
                                    r.generation(), r.reason(), now));
        touched = r.job_id();
        break;
      }
      default: {
        halka::v1::JoinRequest r;
        if (!r.ParseFromArray(bytes, static_cast<int>(n))) break;
        state.WithdrawPending(r.job_id(), r.worker_id());
        touched = r.job_id();
        break;
      }
    }
    (void)state.TakeEvents();
    // A running ring is always ranks 0..G-1, all alive, G within the range.
    auto h = state.Health(touched, now);
    if (h.ok() && (h->state == halka::JobState::kHealthy ||
                   h->state == halka::JobState::kDegraded)) {
      Check(h->world_size >= h->min_world_size &&
            h->world_size <= h->max_world_size);
      Check(static_cast<int>(h->members.size()) == h->world_size);
      for (int i = 0; i < h->world_size; ++i) {
        Check(h->members[static_cast<size_t>(i)].rank == i);
        Check(h->members[static_cast<size_t>(i)].alive);
      }
    }
  }
  Check(static_cast<int>(state.JobIds().size()) <= options.max_jobs);
  return 0;
}
