// How a worker runs its caller's calls: their order of arrival, their
// numbers on the ring (worker/numbering.h applied through RingBook), a
// refused call's number and the peers' news of it, and the re-run of a
// call the membership changed under. The node's life (start, join,
// membership, shutdown) is worker_node.cc.
#include <algorithm>
#include <optional>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/clock.h"
#include "core/cuda/device_memory.h"
#include "worker/op_request.h"
#include "worker/worker_node.h"

namespace halka {
namespace {

// When the call was made, at the latest: when its caller issued it
// (OpSpec.issued_unix_ms, set by the SDK), and no later than its arrival
// (the only bound where the spec is not known yet, or a foreign client
// sets no time).
absl::Time IssuedAt(const v1::OpSpec* spec,
                    const WorkerNode::Arrival& arrival) {
  return spec != nullptr && spec->issued_unix_ms() > 0
             ? std::min(arrival.at,
                        absl::FromUnixMillis(
                            static_cast<int64_t>(spec->issued_unix_ms())))
             : arrival.at;
}

}  // namespace

WorkerNode::Arrival WorkerNode::Arrive() {
  Arrival a;
  a.at = halka::Now();
  a.epoch = book_->epoch();
  // Not under run_mu_ (held for a whole operation): a call that arrives
  // while another runs gets its place in line at once.
  a.ticket = tickets_.fetch_add(1) + 1;
  absl::MutexLock lock(&calls_mu_);
  ++calls_received_;
  return a;
}

absl::StatusOr<OpResult> WorkerNode::Execute(const v1::OpSpec& spec,
                                             void* data) {
  return Execute(spec, data, Arrive());
}

absl::StatusOr<OpResult> WorkerNode::Execute(const v1::OpSpec& spec,
                                             void* data,
                                             const Arrival& arrival) {
  HostOpBuffer buffer(data);
  return Run(spec, buffer, arrival);
}

absl::StatusOr<OpResult> WorkerNode::ExecuteOnDevice(
    const v1::OpSpec& spec, const v1::DeviceTensor& tensor,
    const Arrival& arrival) {
  if (IsPointToPoint(spec)) {
    // A send or recv runs beside the collectives, which own the device
    // context's stream and host mirror while they run.
    return Refuse(arrival,
                  absl::InvalidArgumentError(
                      "send/recv take host memory (or a shm region), not a "
                      "device tensor: copy it to the host first"),
                  &spec);
  }
  if (IsGroupOp(spec)) {
    // As a send or recv: a group's collective runs beside the job's.
    return Refuse(arrival,
                  absl::InvalidArgumentError(
                      "a group's collectives take host memory (or a shm "
                      "region), not a device tensor: copy it to the host "
                      "first"),
                  &spec);
  }
  if (device_ == nullptr) {
    return Refuse(arrival,
                  absl::FailedPreconditionError(absl::StrCat(
                      "worker ", options_.worker_id,
                      " has no usable GPU: send host tensors, or start it "
                      "with --device")),
                  &spec);
  }
  DeviceHandle h;
  h.device = tensor.device();
  h.ipc_handle = tensor.ipc_handle();
  h.offset = tensor.offset();
  h.pid = tensor.pid();
  h.pointer = tensor.pointer();
  absl::StatusOr<void*> ptr = device_->Resolve(h);
  if (!ptr.ok()) return Refuse(arrival, ptr.status(), &spec);
  std::unique_ptr<OpBuffer> buffer = device_->MakeBuffer(*ptr);
  return Run(spec, *buffer, arrival);
}

void WorkerNode::AwaitTurn(uint64_t ticket) {
  auto mine = [this, ticket]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(run_mu_) {
    AbsorbPassed();
    return turn_ >= ticket;
  };
  run_mu_.Await(absl::Condition(&mine));
}

void WorkerNode::AbsorbPassed() {
  absl::MutexLock lock(&passed_mu_);
  while (!passed_.empty() && *passed_.begin() <= turn_) {
    if (*passed_.begin() == turn_) ++turn_;
    passed_.erase(passed_.begin());
  }
}

void WorkerNode::NextTurn() {
  ++turn_;
  AbsorbPassed();
}

void WorkerNode::PassTurn(uint64_t ticket) {
  {
    absl::MutexLock lock(&passed_mu_);
    passed_.insert(ticket);
  }
  // Calls waiting for their turn look again when run_mu_ is next released:
  // by the running call when it ends, or here when none runs.
  if (run_mu_.TryLock()) {
    AbsorbPassed();
    run_mu_.Unlock();
  }
}

absl::Status WorkerNode::Refuse(const Arrival& arrival, absl::Status status,
                               const v1::OpSpec* spec) {
  if (spec != nullptr && IsGroupOp(*spec)) {  // the group's number
    return RunGroup(*spec, nullptr, arrival, status).status();
  }
  absl::MutexLock run_lock(&run_mu_);
  AwaitTurn(arrival.ticket);
  if (spec != nullptr && IsPointToPoint(*spec)) {  // takes no number
    NextTurn();
    return status;
  }
  const absl::Time deadline = arrival.at + options_.op_timeout;
  if (absl::Status late = TakeCallerPlace(spec, arrival, deadline);
      !late.ok()) {
    // Its number was given up when the later call came first: take
    // nothing, and say so (a caller that falls back to another transport on
    // `status` would send a copy).
    RecordCall(0, late);
    status = std::move(late);
  } else {
    NoteCallerPlace(spec,
                    SkipNumber(status, arrival, deadline,
                               IssuedAt(spec, arrival)));
  }
  NextTurn();
  return status;
}

namespace {

// The SDK marked the call with its place in its client's order.
bool Marked(const v1::OpSpec* spec) {
  return spec != nullptr && spec->caller_id() != 0 && spec->call_index() != 0;
}

// The operation number of a call that failed (ABORTED or UNAVAILABLE)
// before it touched the buffer (Communicator's kUntouchedPayload); nullopt
// for any other failure.
std::optional<uint64_t> UntouchedSeq(const absl::Status& status) {
  auto untouched = status.GetPayload(kUntouchedPayload);
  uint64_t n = 0;
  const absl::StatusCode code = status.code();
  if (!untouched.has_value() ||
      !absl::SimpleAtoi(std::string(*untouched), &n) ||
      (code != absl::StatusCode::kAborted &&
       code != absl::StatusCode::kUnavailable)) {
    return std::nullopt;
  }
  return n;
}

}  // namespace

absl::Status WorkerNode::TakeCallerPlace(const v1::OpSpec* spec,
                                         const Arrival& arrival,
                                         absl::Time deadline) {
  if (!Marked(spec)) return absl::OkStatus();
  // The number the call would take: on the newest membership's ring, when
  // it holds one. (No CatchUp here: numbering does it right after; a newer
  // generation still on its way only makes this call infer nothing.)
  uint64_t generation = 0, next = 0;
  if (std::shared_ptr<Ring> ring = book_->Current();
      ring != nullptr && ring->generation == book_->latest_generation() &&
      ring->comm->next_op_seq() != 0) {
    generation = ring->generation;
    next = next_seq_;
  }
  const CallerOrder order = PlaceInCallerOrder(
      caller_, spec->caller_id(), spec->call_index(), next, generation);
  if (order.arrived_late) {
    return absl::AbortedError(absl::StrCat(
        "call ", spec->call_index(), " of this client reached the worker after "
        "its call ", caller_.call_index, ": its number was given up when the "
        "later call came first, so it runs nowhere (call again)"));
  }
  if (order.gap_too_long) {
    log_.Warning(absl::StrCat(
        "calls of a client never reached this worker (its call ",
        spec->call_index(), " came after call ", caller_.call_index,
        "), more than ", kMaxLostCalls, " of them ahead of this worker's "
        "count: nothing given up; the call is numbered as it arrives"));
  }
  for (uint64_t k = 0; k < order.lost; ++k) {
    // Each number on the ring the gap was measured on; a ring that changed
    // meanwhile numbers by its own rules.
    if (std::shared_ptr<Ring> now = book_->Current();
        now == nullptr || now->generation != generation ||
        book_->latest_generation() != generation) {
      break;
    }
    const uint64_t lost_index = spec->call_index() - order.lost + k;
    const Taken t = SkipNumber(
        absl::AbortedError(absl::StrCat(
            "the client's call ", lost_index,
            " never reached this worker (its call ", spec->call_index(),
            " came next: the connection broke on the way?)")),
        arrival, deadline, absl::InfiniteFuture());
    log_.Warning(absl::StrCat(
        "a client's call ", lost_index, " never reached this worker (its call ",
        spec->call_index(), " came next): gave its number #", t.seq,
        " up, so the next call pairs with the peers' again"));
  }
  return absl::OkStatus();
}

void WorkerNode::NoteCallerPlace(const v1::OpSpec* spec, Taken taken) {
  if (!Marked(spec)) return;
  caller_ = CallerPlace{spec->caller_id(), spec->call_index(), taken.seq,
                        taken.seq == 0 ? 0 : taken.generation};
}

WorkerNode::Taken WorkerNode::SkipNumber(const absl::Status& status,
                                         const Arrival& arrival,
                                         absl::Time deadline,
                                         absl::Time issued) {
  // The number the call takes is the communicator's: the ring's next one,
  // or, on a ring that still adopts, the one its peers run. The ring is the
  // newest membership's, built here if no call has run on it yet: the
  // peers run their copies of this call there, and a refusal sent on an
  // older ring would leave them waiting until their deadline.
  CatchUp();
  const CallInfo call =
      NewCall(std::max<uint64_t>(next_seq_, 1), arrival, issued);
  absl::StatusOr<std::shared_ptr<Ring>> ring = book_->Acquire(call);
  if (!ring.ok()) {
    // As a call that cannot run: numbered where this worker holds a number
    // (the peers' copies fail too), else not at all; a stale call never
    // (its peers' copy is long over; their next call pairs with this
    // worker's next: system_faults' sigstop, where an upload the SIGSTOP
    // cut short was refused after the worker re-joined and gave the
    // peers' next number up, leaving this worker one call ahead).
    if (call.numbered_generation != 0 && !RefusedAsStale(ring.status())) {
      RecordCall(next_seq_, status);
      return Taken{next_seq_++, call.numbered_generation};
    }
    RecordCall(0, status);
    return Taken{};
  }
  absl::StatusOr<uint64_t> seq =
      (*ring)->comm->SkipOp(call.seq, status, deadline);
  if (!seq.ok()) {
    log_.Warning(absl::StrCat("a call ended before it reached the ring (",
                            status.ToString(), ") and no number could be "
                            "learnt for it: ", seq.status().ToString()));
    RecordCall(0, status);
    return Taken{};
  }
  next_seq_ = *seq + 1;
  RecordCall(*seq, status);
  return Taken{*seq, (*ring)->generation};
}

CallInfo WorkerNode::NewCall(uint64_t seq, const Arrival& arrival,
                             absl::Time issued) {
  CallInfo call;
  call.seq = seq;
  call.epoch = arrival.epoch;
  call.issued = issued;
  if (std::shared_ptr<Ring> now = book_->Current();
      now != nullptr && now->comm->next_op_seq() != 0) {
    call.numbered_generation = now->generation;
  }
  return call;
}

void WorkerNode::RecordCall(uint64_t seq, const absl::Status& status) {
  bool changed;
  {
    absl::MutexLock lock(&calls_mu_);
    const bool was_failing = last_call_recorded_ && !last_call_ok_;
    last_call_recorded_ = true;
    last_call_seq_ = seq;
    last_call_ok_ = status.ok();
    last_call_error_ = status.ok() ? "" : status.ToString();
    changed = was_failing != !status.ok();
  }
  // The rendezvous's verdict (failing or not) follows this outcome: tell
  // it before the caller hears of it, so that health asked next is current.
  if (changed) link_->BeatNow();
}

absl::StatusOr<OpResult> WorkerNode::RunOn(Communicator* comm,
                                           const v1::OpSpec& spec,
                                           OpBuffer& buffer,
                                           absl::Time deadline) {
  // `spec` passed ValidateOpSpec (Run).
  const absl::Duration timeout =
      std::max(deadline - halka::Now(), absl::Milliseconds(1));
  switch (spec.kind()) {
    case v1::ALL_REDUCE: {
      Algorithm algorithm = static_cast<Algorithm>(spec.algorithm());
      // A group's auto is the engine's (the parameter server serves the
      // job's ring only).
      if (algorithm == Algorithm::kAuto && !IsGroupOp(spec)) {
        algorithm = options_.default_algorithm;
      }
      if (algorithm == Algorithm::kParameterServer) {
        absl::Status s = EnsureServers(deadline);
        if (!s.ok()) return s;
      }
      auto result = comm->AllReduce(buffer, spec.count(),
                                    static_cast<DType>(spec.dtype()),
                                    static_cast<ReduceOp>(spec.op()), timeout,
                                    algorithm);
      if (!result.ok() && algorithm == Algorithm::kParameterServer) {
        // The server may have moved: look it up again next time.
        absl::MutexLock lock(&servers_mu_);
        have_servers_ = false;
      }
      return result;
    }
    case v1::BROADCAST:
      return comm->Broadcast(buffer, spec.count(),
                             static_cast<DType>(spec.dtype()), spec.root(),
                             timeout, static_cast<Algorithm>(spec.algorithm()));
    case v1::BARRIER:
      return comm->Barrier(timeout);
    // The worker's --algorithm is all-reduce's: these run as asked (auto
    // is the ring; naive and ps answer UNIMPLEMENTED).
    case v1::ALL_GATHER:
      return comm->AllGather(
          buffer, spec.count(), spec.recv_count(),
          static_cast<int>(std::min<uint64_t>(spec.input_slice(), INT32_MAX)),
          static_cast<DType>(spec.dtype()), timeout,
          static_cast<Algorithm>(spec.algorithm()));
    case v1::REDUCE_SCATTER:
      return comm->ReduceScatter(buffer, spec.count(), spec.recv_count(),
                                 static_cast<DType>(spec.dtype()),
                                 static_cast<ReduceOp>(spec.op()), timeout,
                                 static_cast<Algorithm>(spec.algorithm()));
    case v1::REDUCE:
      return comm->Reduce(buffer, spec.count(),
                          static_cast<DType>(spec.dtype()),
                          static_cast<ReduceOp>(spec.op()), spec.root(),
                          timeout, static_cast<Algorithm>(spec.algorithm()));
    case v1::GATHER:
      return comm->Gather(
          buffer, spec.count(), spec.recv_count(),
          static_cast<int>(std::min<uint64_t>(spec.input_slice(), INT32_MAX)),
          static_cast<DType>(spec.dtype()), spec.root(), timeout,
          static_cast<Algorithm>(spec.algorithm()));
    case v1::SCATTER:
      return comm->Scatter(buffer, spec.count(), spec.recv_count(),
                           static_cast<DType>(spec.dtype()), spec.root(),
                           timeout, static_cast<Algorithm>(spec.algorithm()));
    case v1::ALL_TO_ALL:
      return comm->AllToAll(buffer, spec.count(),
                            static_cast<DType>(spec.dtype()), timeout,
                            static_cast<Algorithm>(spec.algorithm()));
    default:  // refused by ValidateOpSpec
      return absl::InternalError(
          absl::StrCat("unknown operation kind ", spec.kind()));
  }
}

absl::StatusOr<OpResult> WorkerNode::Run(const v1::OpSpec& spec,
                                         OpBuffer& buffer,
                                         const Arrival& arrival) {
  if (IsPointToPoint(spec)) return RunPeer(spec, buffer, arrival);
  if (IsGroupOp(spec)) return RunGroup(spec, buffer, arrival);
  absl::MutexLock run_lock(&run_mu_);
  AwaitTurn(arrival.ticket);
  running_seq_ = 0;
  taken_ = Taken{};
  if (absl::Status late = TakeCallerPlace(
          &spec, arrival, CallDeadline(spec, arrival.at, options_.op_timeout));
      !late.ok()) {
    RecordCall(0, late);
    NextTurn();
    return late;
  }
  absl::StatusOr<OpResult> result = RunInTurn(spec, buffer, arrival);
  if (result.ok() || running_seq_ != 0) {
    RecordCall(result.ok() ? result->op_seq : running_seq_, result.status());
  }
  NoteCallerPlace(&spec, result.ok()
                             ? Taken{result->op_seq, result->generation}
                             : taken_);
  NextTurn();
  return result;
}

absl::StatusOr<OpResult> WorkerNode::RunInTurn(const v1::OpSpec& spec,
                                               OpBuffer& buffer,
                                               const Arrival& arrival) {
  const absl::Time deadline =
      CallDeadline(spec, arrival.at, options_.op_timeout);
  const absl::Time issued = IssuedAt(&spec, arrival);
  if (absl::StatusOr<uint64_t> bytes =
          ValidateOpSpec(spec, options_.max_op_bytes);
      !bytes.ok()) {
    taken_ = SkipNumber(bytes.status(), arrival, deadline, issued);
    return bytes.status();
  }
  uint64_t retry_seq = 0;
  std::string retry_cause;
  // A re-run's failure says why the call was first re-run (that names the
  // lost peer) and how often, not only what it waited for on the new ring.
  auto rerun_failed = [&](const absl::Status& status, int runs,
                          uint64_t generation) {
    return absl::Status(
        status.code(),
        absl::StrCat(status.message(), " (re-run ", runs,
                     runs == 1 ? " time" : " times", ", last on generation ",
                     generation, ", first after: ", retry_cause, ")"));
  };
  for (int attempt = 0;; ++attempt) {
    CatchUp();
    CallInfo call =
        NewCall(retry_seq > 0 ? retry_seq : next_seq_, arrival, issued);
    call.retry = retry_seq > 0;
    running_seq_ = call.seq;
    absl::StatusOr<std::shared_ptr<Ring>> ring = book_->Acquire(call);
    if (!ring.ok()) {
      // The call is numbered all the same (where this worker holds a
      // number): the other ranks' copies of it fail too (or already ran),
      // and the next call is the next number. Not a stale call: it
      // belongs to no operation of the ring (SkipNumber).
      if (RefusedAsStale(ring.status())) {
        running_seq_ = 0;
      } else if (call.numbered_generation != 0 && retry_seq == 0) {
        taken_ = Taken{next_seq_++, call.numbered_generation};
      }
      if (retry_seq > 0) {
        return rerun_failed(ring.status(), attempt, book_->latest_generation());
      }
      return ring.status();
    }
    Communicator* comm = (*ring)->comm.get();
    if (comm->next_op_seq() != 0 && call.seq != 0) {
      comm->set_next_op_seq(call.seq);
      taken_ = Taken{call.seq, (*ring)->generation};
    } else {
      taken_ = Taken{};  // adopted from the peers: not known before it ran
    }
    absl::StatusOr<OpResult> result = RunOn(comm, spec, buffer, deadline);
    next_seq_ = comm->next_op_seq();
    // Refused before it reached the ring's numbering (a broadcast root
    // outside the world, no parameter server): the number is still free,
    // and the caller's place is not known from it.
    if (next_seq_ == call.seq) taken_ = Taken{};
    if (result.ok()) return result;
    // Failed before it sent any data, because the membership changed (a
    // peer's link broke, the rendezvous pushed a new generation, a peer
    // already runs the next one): no rank can have completed it, so run it
    // again on the new ring with the same sequence number. The new
    // generation may still be on its way (the rendezvous probes a broken
    // link's peer first): wait for it briefly. A re-run that fails the
    // same way runs again (two members lost one after the other, as a
    // host's workers reported one at a time, are two generations: a re-run
    // on the first meets the second's loss, while a peer's lands on the
    // second and waits for this rank there).
    const std::optional<uint64_t> n = UntouchedSeq(result.status());
    const bool again =
        n.has_value() && attempt < 4 && halka::Now() < deadline &&
        book_->AwaitNewerGeneration(
            (*ring)->generation,
            std::min(deadline, halka::Now() + absl::Milliseconds(1500)));
    if (!again) {
      if (retry_seq == 0) return result;
      return rerun_failed(result.status(), attempt, (*ring)->generation);
    }
    log_.Info(absl::StrCat("operation #", *n, " had not touched the buffer when "
                         "the membership changed: running it on the new ring"));
    if (retry_seq == 0) retry_cause = std::string(result.status().message());
    retry_seq = *n;
  }
}

absl::StatusOr<OpResult> WorkerNode::RunPeer(const v1::OpSpec& spec,
                                             OpBuffer& buffer,
                                             const Arrival& arrival) {
  const absl::Time deadline =
      CallDeadline(spec, arrival.at, options_.op_timeout);
  absl::StatusOr<uint64_t> bytes = ValidateOpSpec(spec, options_.max_op_bytes);
  // A send or recv takes no number and needs no agreement of its own: where
  // the ring it would run on exists already, it takes it at once and runs
  // beside whatever runs (a collective waiting for the peer that waits for
  // this send must not hold it up), passing its turn to the calls after it.
  absl::StatusOr<std::shared_ptr<Ring>> ring =
      RingBeside(arrival, bytes.ok(), IssuedAt(&spec, arrival));
  if (!bytes.ok()) return bytes.status();
  if (!ring.ok()) return ring.status();
  const absl::Duration timeout =
      std::max(deadline - halka::Now(), absl::Milliseconds(1));
  Communicator* comm = (*ring)->comm.get();
  return spec.kind() == v1::SEND
             ? comm->Send(buffer, *bytes, spec.peer(), spec.tag(), timeout)
             : comm->Recv(buffer, *bytes, spec.peer(), spec.tag(), timeout);
}

absl::StatusOr<std::shared_ptr<Ring>> WorkerNode::RingBeside(
    const Arrival& arrival, bool needed, absl::Time issued) {
  CallInfo now;  // not NewCall: a running collective holds its ring's number
  now.epoch = arrival.epoch;
  now.issued = issued;
  absl::StatusOr<std::shared_ptr<Ring>> ring =
      needed ? book_->Ready(now) : nullptr;
  if (!needed || *ring != nullptr) {
    PassTurn(arrival.ticket);
    return ring;
  }
  // No ring yet (or a newer membership's is still to be built): in its
  // turn, it takes the ring the next collective would run on (built here
  // if none has yet), leaving the numbering as it is.
  absl::MutexLock run_lock(&run_mu_);
  AwaitTurn(arrival.ticket);
  CatchUp();
  ring = book_->Acquire(NewCall(next_seq_, arrival, issued));
  NextTurn();
  return ring;
}

absl::StatusOr<OpResult> WorkerNode::RunGroup(const v1::OpSpec& spec,
                                              OpBuffer* buffer,
                                              const Arrival& arrival,
                                              absl::Status refused) {
  const absl::Time deadline =
      CallDeadline(spec, arrival.at, options_.op_timeout);
  const std::vector<int> ranks(spec.group_ranks().begin(),
                               spec.group_ranks().end());
  const std::string name = absl::StrCat(
      "group [", absl::StrJoin(ranks, ","), "]",
      spec.group_tag() == 0 ? "" : absl::StrCat(" tag ", spec.group_tag()));
  auto in_group = [&name](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat(name, ": ", s.message()));
  };
  if (refused.ok()) {
    if (absl::StatusOr<uint64_t> bytes =
            ValidateOpSpec(spec, options_.max_op_bytes);
        !bytes.ok()) {
      refused = bytes.status();
    } else if (spec.kind() == v1::ALL_REDUCE &&
               spec.algorithm() == v1::PS) {
      refused = absl::InvalidArgumentError(
          "all_reduce: the parameter server serves the whole job, not a "
          "group");
    }
  }
  // A group's calls take no number of the job's: like a send or recv, it
  // runs beside the job's collectives, on the ring they run on, in its
  // group's order (one operation of a group at a time).
  //
  // A call the membership changed under fails (ABORTED or UNAVAILABLE,
  // naming the change; at once when it was still comparing fingerprints,
  // RingBook::InboxFor) and is not run again: the group's ranks may name
  // other workers on the new ring, and its numbering starts over there.
  // The caller calls again.
  // A stale call (made before this worker re-joined) is refused here and
  // gives no number of the group's up: its peers' copy is long over.
  absl::StatusOr<std::shared_ptr<Ring>> ring =
      RingBeside(arrival, true, IssuedAt(&spec, arrival));
  if (!ring.ok()) return refused.ok() ? in_group(ring.status()) : refused;
  absl::StatusOr<std::shared_ptr<SubRing>> group =
      (*ring)->Group(ranks, spec.group_tag());
  if (!group.ok()) return refused.ok() ? in_group(group.status()) : refused;
  Communicator& comm = (*group)->comm();
  if (!refused.ok()) {
    // Its number in the group is given up: the members' copies fail at
    // once, naming this rank.
    comm.SkipNextOp(refused).IgnoreError();
    return in_group(refused);
  }
  absl::StatusOr<OpResult> result = RunOn(&comm, spec, *buffer, deadline);
  if (!result.ok()) return in_group(result.status());
  return result;
}

absl::Status WorkerNode::EnsureServers(absl::Time deadline) {
  absl::MutexLock lock(&servers_mu_);
  if (have_servers_) return absl::OkStatus();
  bool said = false;
  for (;;) {
    std::string message;
    absl::StatusOr<std::vector<PeerInfo>> servers =
        link_->LookupServers(&message);
    if (servers.ok()) {
      book_->SetServers(*servers);
      have_servers_ = true;
      if (said) log_.Info("parameter server found");
      return absl::OkStatus();
    }
    if (!said) {
      log_.Info(message);  // "waiting for parameter server of job X"
      said = true;
    }
    if (halka::Now() + absl::Milliseconds(200) >= deadline || link_->stopped()) {
      return absl::DeadlineExceededError(absl::StrCat(
          "all_reduce (ps): no parameter server before the deadline: ",
          message));
    }
    absl::SleepFor(absl::Milliseconds(200));
  }
}

}  // namespace halka
