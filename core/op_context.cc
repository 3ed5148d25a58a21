#include "core/op_context.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/clock.h"
#include "core/ring_plan.h"
#include "core/stall_monitor.h"

namespace halka {

std::string DescribePeer(const PeerInfo& peer) {
  return absl::StrCat("rank ", peer.rank, " (", peer.worker_id, ", ",
                      peer.address, ")");
}

// ---------------------------------------------------------------------------
// ProgressLedger

void ProgressLedger::Start(std::string op) {
  absl::MutexLock lock(&mu_);
  progress_ = Progress();
  progress_.busy = true;
  progress_.op = std::move(op);
  touched_ = false;
  untouched_abort_ = absl::OkStatus();
}

void ProgressLedger::Describe(std::string op) {
  absl::MutexLock lock(&mu_);
  progress_.op = std::move(op);
}

void ProgressLedger::Set(Phase phase, int step, int chunk, int chunks,
                         int awaited) {
  absl::MutexLock lock(&mu_);
  progress_.phase = phase;
  progress_.step = step;
  progress_.chunk = chunk;
  progress_.chunks = chunks;
  if (progress_.awaited_rank != awaited) {
    progress_.awaited_rank = awaited;
    progress_.waiting_since = halka::Now();
  }
}

absl::Status ProgressLedger::EndUntouched(absl::Status status) {
  absl::MutexLock lock(&mu_);
  if (status.ok() && !untouched_abort_.ok()) {
    status = untouched_abort_;  // asked for before the buffer was touched
  }
  touched_ = status.ok();
  return status;
}

bool ProgressLedger::RequestUntouchedAbort(const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  if (!progress_.busy || touched_) return false;
  untouched_abort_ = status;
  return true;
}

void ProgressLedger::Finish() {
  absl::MutexLock lock(&mu_);
  progress_ = Progress();
}

Progress ProgressLedger::Get() const {
  absl::MutexLock lock(&mu_);
  return progress_;
}

// ---------------------------------------------------------------------------
// OpContext: state

OpContext::OpContext(const CommParts& parts, const Fingerprint& fp,
                     OpBuffer* buffer, absl::Duration timeout,
                     absl::Time start, Algorithm algorithm,
                     std::vector<PeerInfo> servers)
    : config_(*parts.config),
      path_(config_.world_size, config_.ring_order),
      transport_(parts.transport),
      inbox_(parts.inbox),
      telemetry_(parts.telemetry),
      progress_(parts.progress),
      fp_(fp),
      caller_buffer_(buffer),
      buffer_(buffer),
      start_(start),
      timeout_(timeout > absl::ZeroDuration() ? timeout
                                              : config_.default_timeout),
      deadline_(start_ + timeout_),
      algorithm_(algorithm),
      all_to_all_(config_.world_size > 1 &&
                  config_.world_size <= config_.all_to_all_max_world),
      servers_(std::move(servers)) {
  phase_start_ = start_;
  fp_.resolved = algorithm_;  // what this rank's fingerprint says it runs
  const int g = config_.world_size;
  const int r = config_.rank;
  if (all_to_all_) {
    for (int k = 0; k < g; ++k) {
      if (k != r) watch_.push_back(k);
    }
  } else if (g > 1) {
    watch_ = {succ(), pred()};
  }
  for (int k = 0; k < this->servers(); ++k) watch_.push_back(g + k);
  TrackSegments(static_cast<size_t>(g));
}

FrameMeta OpContext::FingerprintMeta() const {
  FrameMeta meta;
  meta.kind = FrameKind::kFingerprint;
  meta.generation = config_.generation;
  meta.op_seq = fp_.op_seq;
  meta.phase = Phase::kFingerprint;
  meta.sender_rank = config_.rank;
  meta.origin_rank = config_.rank;
  meta.fingerprint = fp_;
  meta.dtype = fp_.dtype;
  return meta;
}

FrameMeta OpContext::DataMeta(Phase phase) const {
  FrameMeta meta;
  meta.kind = FrameKind::kData;
  meta.generation = config_.generation;
  meta.op_seq = fp_.op_seq;
  meta.phase = phase;
  meta.dtype = fp_.dtype;
  meta.op = fp_.op;
  meta.sender_rank = config_.rank;
  return meta;
}

FrameMeta OpContext::ChunkMeta(Phase phase, int step, int segment,
                               const Range& c) const {
  FrameMeta meta = DataMeta(phase);
  meta.step = step;
  meta.segment = segment;
  meta.offset = c.offset;
  meta.count = c.count;
  return meta;
}

// ---------------------------------------------------------------------------
// OpContext: I/O

absl::Status OpContext::Send(int to, const FrameMeta& meta,
                             const uint8_t* payload, size_t bytes,
                             int segment) {
  std::shared_ptr<SendTracker> tracker = sends_;
  {
    absl::MutexLock lock(&tracker->mu);
    ++tracker->total;
    if (segment >= 0) ++tracker->per_segment[static_cast<size_t>(segment)];
  }
  const absl::Time t0 = halka::Now();
  absl::Status s = transport_->Send(
      to, meta, absl::MakeConstSpan(payload, bytes),
      [tracker, segment, to, bytes, t0] {
        const absl::Time released = halka::Now();
        absl::MutexLock lock(&tracker->mu);
        absl::Time& last = tracker->last_release[to];
        tracker->wire.push_back(
            {to, bytes, std::max(t0, last), released});
        last = released;
        --tracker->total;
        if (segment >= 0) --tracker->per_segment[static_cast<size_t>(segment)];
      });
  const absl::Time t1 = halka::Now();
  telemetry_->BookSend(t1, to, bytes, t1 - t0, s.ok());
  Trace(TraceSpan::Kind::kSend, to, bytes, t0, t1);
  if (!s.ok()) {
    return absl::UnavailableError(absl::StrCat(
        Where(), ": cannot send to ", Who(to), " in ", PhaseName(phase_),
        " step ", step_, ": ", s.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<InFrame> OpContext::Await(int from, const std::string& detail) {
  SetLedger(phase_, step_, chunk_, chunks_, from);
  const absl::Time t0 = halka::Now();
  Inbox::Event ev =
      inbox_->Next(from, fp_.op_seq, watch_, deadline_ + wait_slack_);
  const absl::Time t1 = halka::Now();
  // Time this process did not run is not time `from` kept it waiting.
  const absl::Duration stalled = StallMonitor::Get().StalledBetween(t0, t1);
  const absl::Duration waited = std::max(absl::ZeroDuration(),
                                         t1 - t0 - stalled);
  const bool arrival = phase_ == Phase::kFingerprint;
  switch (ev.type) {
    case Inbox::Event::kFrame:
      telemetry_->BookWait(t1, OpTelemetry::WaitEnd::kFrame, from,
                           ev.frame.PayloadBytes(), waited, arrival);
      break;
    case Inbox::Event::kLinkFailed:
      telemetry_->BookWait(t1, OpTelemetry::WaitEnd::kLinkFailed, ev.peer, 0,
                           waited);
      break;
    default:
      telemetry_->BookWait(t1, OpTelemetry::WaitEnd::kOther, from, 0, waited);
      break;
  }
  Trace(TraceSpan::Kind::kWait, from,
        ev.type == Inbox::Event::kFrame ? ev.frame.PayloadBytes() : 0, t0, t1);
  if (stalled > absl::ZeroDuration()) {
    Trace(TraceSpan::Kind::kStall, -1, 0, t1 - stalled, t1);
  }
  if (ev.type == Inbox::Event::kFrame) {
    if (ev.frame.intact) {
      const bool known =
          std::any_of(intact_.begin(), intact_.end(),
                      [&](const auto& i) { return i.first == from; });
      if (!known) intact_.emplace_back(from, ev.frame.intact);
    }
    return std::move(ev.frame);
  }
  const std::string where =
      absl::StrFormat("%s step %d, chunk %d of %d", PhaseName(phase_), step_,
                      chunk_ + 1, std::max(chunks_, 1));
  switch (ev.type) {
    case Inbox::Event::kAbort: {
      abort_from_ = ev.frame.meta.sender_rank;
      late_ranks_ = ev.frame.meta.late_ranks;
      absl::StatusCode code = ev.frame.meta.abort_code;
      if (code == absl::StatusCode::kOk) code = absl::StatusCode::kAborted;
      return absl::Status(code, absl::StrCat(Where(), ": aborted in ", where,
                                             " because ",
                                             ev.frame.meta.message));
    }
    case Inbox::Event::kLinkFailed:
      return absl::UnavailableError(
          absl::StrCat(Where(), ": link with ", Who(ev.peer), " broke in ",
                       where, ": ", ev.status.message()));
    case Inbox::Event::kInterrupted:
      return absl::Status(ev.status.code(),
                          absl::StrCat(Where(), ": interrupted in ", where,
                                       ": ", ev.status.message()));
    case Inbox::Event::kFrame:
    case Inbox::Event::kTimeout:
      break;
  }
  timed_out_ = true;
  return absl::DeadlineExceededError(absl::StrCat(
      Where(), ": deadline of ", absl::FormatDuration(timeout_),
      " exceeded waiting for ", Who(from), " in ", where,
      detail.empty() ? "" : " (", detail, detail.empty() ? "" : ")"));
}

absl::Status OpContext::CheckIntact() const {
  for (const auto& [from, intact] : intact_) {
    if (!intact()) {
      return absl::DataLossError(absl::StrCat(
          Where(), ": the link from ", Who(from), " lost its shared memory "
          "while this operation read from it (the ring was truncated by "
          "another process): the result is not valid"));
    }
  }
  return absl::OkStatus();
}

absl::Status OpContext::CheckData(const InFrame& frame, int from,
                                  const FrameMeta& expect) const {
  const FrameMeta& m = frame.meta;
  const size_t bytes =
      static_cast<size_t>(expect.count) * DTypeSize(fp_.dtype);
  if (m.kind != FrameKind::kData || m.generation != config_.generation ||
      m.phase != expect.phase || m.step != expect.step ||
      m.segment != expect.segment || m.offset != expect.offset ||
      m.count != expect.count || m.dtype != fp_.dtype ||
      frame.PayloadBytes() != bytes) {
    return absl::DataLossError(absl::StrFormat(
        "%s: corrupt frame from %s: expected generation %d %s step %d "
        "segment %d offset %d count %d (%d bytes), got generation %d %s "
        "step %d segment %d offset %d count %d (%d bytes)",
        Where(), Who(from), config_.generation, PhaseName(expect.phase),
        expect.step, expect.segment, expect.offset, expect.count, bytes,
        m.generation, PhaseName(m.phase), m.step, m.segment, m.offset,
        m.count, frame.PayloadBytes()));
  }
  return absl::OkStatus();
}

absl::StatusOr<InFrame> OpContext::AwaitFingerprint(
    int from, int origin, const std::string& detail) {
  timed_out_ = false;
  absl::StatusOr<InFrame> in = Await(from, detail);
  if (!in.ok() && timed_out_) late_ranks_ = {origin};
  return in;
}

void OpContext::AlsoLate(absl::Span<const int> others) {
  if (!timed_out_ || late_ranks_.empty()) return;
  for (int r : inbox_->WithoutFrameOf(others, fp_.op_seq)) {
    if (late_ranks_.size() >= kMaxLateRanks) break;
    late_ranks_.push_back(r);
  }
}

absl::StatusOr<InFrame> OpContext::AwaitData(int from,
                                             const FrameMeta& expect) {
  absl::StatusOr<InFrame> in = Await(from);
  if (!in.ok()) return in;
  absl::Status checked = CheckData(*in, from, expect);
  if (!checked.ok()) return checked;
  return in;
}

OpContext::~OpContext() { WithdrawRecvs(); }

bool OpContext::SegmentReleased(int segment) {
  absl::MutexLock lock(&sends_->mu);
  return sends_->per_segment[static_cast<size_t>(segment)] == 0;
}

void OpContext::PostRecv(int from, const FrameMeta& expect) {
  const size_t bytes =
      static_cast<size_t>(expect.count) * DTypeSize(fp_.dtype);
  uint8_t* dst = buffer_->LandingView(expect.offset, expect.count);
  if (dst == nullptr || bytes < kMinLandingBytes) return;
  std::shared_ptr<Landing> landing =
      inbox_->landings()->Offer(from, expect, dst, bytes);
  if (landing != nullptr) landings_.push_back(std::move(landing));
}

void OpContext::WithdrawRecvs() {
  inbox_->landings()->Withdraw(landings_);
  landings_.clear();
}

void OpContext::Watch(int rank) {
  if (rank == config_.rank) return;
  if (std::find(watch_.begin(), watch_.end(), rank) == watch_.end()) {
    watch_.push_back(rank);
  }
}

void OpContext::TrackSegments(size_t segments) {
  absl::MutexLock lock(&sends_->mu);
  if (segments > sends_->per_segment.size()) {
    sends_->per_segment.resize(segments, 0);
  }
}

bool OpContext::WaitForReleases(int segment, absl::Time deadline) {
  SendTracker* t = sends_.get();
  auto released = [t, segment]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(t->mu) {
    return segment < 0 ? t->total == 0
                       : t->per_segment[static_cast<size_t>(segment)] == 0;
  };
  const absl::Time t0 = halka::Now();
  bool done;
  {
    absl::MutexLock lock(&t->mu);
    done = t->mu.AwaitWithDeadline(absl::Condition(&released), deadline);
  }
  TraceStall(t0);
  return done;
}

// Waiting for the wire to let go of a segment (or of every frame) is a
// window stall: a timeline span when it takes 10 us or more.
void OpContext::TraceStall(absl::Time t0) {
  const absl::Time t1 = halka::Now();
  if (t1 - t0 >= absl::Microseconds(10)) {
    Trace(TraceSpan::Kind::kWindow, -1, 0, t0, t1);
  }
}

void OpContext::ReleaseEverything(absl::Time deadline) {
  if (WaitForReleases(-1, deadline)) return;
  SendTracker* t = sends_.get();
  auto released = [t]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(t->mu) {
    return t->total == 0;
  };
  const absl::Time t0 = halka::Now();
  // A peer that stopped reading still holds frames that point into the
  // caller's buffer. Cancelling the links releases them at once; the buffer
  // must not be handed back before that.
  // Every link this op may have sent on: the ring neighbours, every rank
  // (naive, all-to-all fingerprints) and the parameter-server shards; a
  // link that does not exist is skipped by the transport.
  const int g = config_.world_size;
  for (int to = 0; to < g + servers(); ++to) {
    if (to != config_.rank) transport_->Reset(to);
  }
  {
    absl::MutexLock lock(&t->mu);
    t->mu.Await(absl::Condition(&released));
  }
  TraceStall(t0);
}

FrameMeta AbortMeta(const CommConfig& config, uint64_t op_seq,
                    absl::StatusCode code, std::string message) {
  FrameMeta meta;
  meta.kind = FrameKind::kAbort;
  meta.generation = config.generation;
  meta.op_seq = op_seq;
  meta.sender_rank = config.rank;
  meta.origin_rank = config.rank;
  meta.abort_code = code;
  meta.message = std::move(message);
  return meta;
}

void OpContext::SendAbort(const absl::Status& status) {
  FrameMeta meta = AbortMeta(config_, fp_.op_seq, status.code(),
                             std::string(status.message()));
  meta.late_ranks = late_ranks_;
  const int g = config_.world_size;
  // Every rank this operation watches (all of them with fingerprints
  // all-to-all; else the ring's neighbours and the ranks an algorithm
  // talks to beyond them: the tree's, two-level's cross-host ring's), and
  // the parameter-server shards; each once.
  std::vector<int> targets = watch_;
  if (!all_to_all_) {
    targets.push_back(succ());
    targets.push_back(pred());
  }
  for (int k = 0; k < servers(); ++k) targets.push_back(g + k);
  std::sort(targets.begin(), targets.end());
  targets.erase(std::unique(targets.begin(), targets.end()), targets.end());
  for (int to : targets) {
    if (to == abort_from_ || to == config_.rank) continue;
    // Best effort: a broken link cannot carry the news, and the other
    // direction around the ring does.
    transport_->Send(to, meta, {}, [] {}).IgnoreError();
  }
}

// ---------------------------------------------------------------------------
// OpContext: ledgers and error text

void OpContext::SetLedger(Phase phase, int step, int chunk, int chunks,
                          int awaited) {
  if (ledger_held_) {
    progress_->Set(phase_, step_, chunk_, chunks_, awaited);
    return;
  }
  if (phase != phase_) {
    const absl::Time now = halka::Now();
    Trace(TraceSpan::Kind::kPhase, -1, 0, phase_start_, now);
    if (phase_ == Phase::kFingerprint) fingerprint_end_ = now;
    phase_start_ = now;
  }
  phase_ = phase;
  step_ = step;
  chunk_ = chunk;
  chunks_ = chunks;
  progress_->Set(phase, step, chunk, chunks, awaited);
}

absl::Duration OpContext::RecordReduce(int peer, absl::Duration spent) {
  if (config_.test_reduce_delay > absl::ZeroDuration()) {
    absl::SleepFor(config_.test_reduce_delay);
    spent += config_.test_reduce_delay;
  }
  const absl::Time now = halka::Now();
  telemetry_->BookReduce(now, peer, spent);
  Trace(TraceSpan::Kind::kReduce, peer, 0, now - spent, now);
  return spent;
}

void OpContext::Trace(TraceSpan::Kind kind, int peer, uint64_t bytes,
                      absl::Time from, absl::Time to) {
  TraceSpan span;
  span.kind = kind;
  span.phase = phase_;
  span.step = step_;
  span.chunk = chunk_;
  span.peer = peer;
  span.bytes = bytes;
  span.start = from;
  span.end = to;
  telemetry_->BookSpan(span);
}

void OpContext::EndTrace() {
  std::vector<WireSpan> wire;
  {
    absl::MutexLock lock(&sends_->mu);
    wire.swap(sends_->wire);
  }
  for (const WireSpan& w : wire) {
    // A stopped sender's link does not move its frames either.
    const absl::Duration busy =
        w.end - w.start - StallMonitor::Get().StalledBetween(w.start, w.end);
    telemetry_->BookWire(w.end, w.peer, std::max(busy, absl::ZeroDuration()));
    Trace(TraceSpan::Kind::kWire, w.peer, w.bytes, w.start, w.end);
  }
  Trace(TraceSpan::Kind::kPhase, -1, 0, phase_start_, halka::Now());
}

void OpContext::RecordReduceTotal(absl::Duration spent) {
  telemetry_->BookReduceTotal(spent);
}

std::string OpContext::Who(int rank) const {
  if (rank >= 0 && rank < config_.world_size) {
    return DescribePeer(config_.members[static_cast<size_t>(rank)]);
  }
  const int shard = rank - config_.world_size;
  if (shard >= 0 && shard < servers()) {
    const PeerInfo& s = servers_[static_cast<size_t>(shard)];
    return absl::StrCat("parameter server shard ", shard, " (", s.worker_id,
                        ", ", s.address, ")");
  }
  return absl::StrCat("rank ", rank);
}

std::string OpContext::Where() const {
  return absl::StrCat(Who(config_.rank), ": ", fp_.ToString());
}

}  // namespace halka
