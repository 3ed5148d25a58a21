#include "worker/core/communicator.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "worker/core/op_buffer.h"
#include "worker/core/payload.h"
#include "worker/core/reduce.h"
#include "worker/core/ring_plan.h"
#include "worker/core/status_macros.h"

namespace halka {
namespace {

// Counts frames the transport still holds, per segment, so that a segment
// is never overwritten while the wire may still read it, and the operation
// never returns while the caller's buffer is referenced.
struct SendTracker {
  absl::Mutex mu;
  std::vector<int> per_segment ABSL_GUARDED_BY(mu);
  int total ABSL_GUARDED_BY(mu) = 0;
};

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

}  // namespace

const std::vector<double> kLatencyBounds = {
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1,      2.5,   5,      10,    30,   60,    1e300};

std::string DescribePeer(const PeerInfo& peer) {
  return absl::StrCat("rank ", peer.rank, " (", peer.worker_id, ", ",
                      peer.address, ")");
}

struct Communicator::Op {
  Fingerprint fp;
  absl::Time start;
  absl::Time deadline;
  absl::Duration timeout;
  OpBuffer* buf = nullptr;
  std::vector<int> watch;
  std::shared_ptr<SendTracker> sends = std::make_shared<SendTracker>();
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  Phase phase = Phase::kFingerprint;
  int step = 0;
  int chunk = 0;
  int chunks = 0;
  int abort_from = -1;  // neighbour whose ABORT frame failed this op
  Algorithm algorithm = Algorithm::kRing;  // resolved
  bool all_to_all = false;
  std::vector<InFrame> eager;  // by rank, for an eager naive all-reduce
  int servers = 0;             // parameter-server shards (ranks G..G+K-1)
  EdgeSummary edges;           // this operation's per-edge sums
  std::map<int, std::vector<double>> waits;  // per-frame waits, by peer
};

Communicator::Communicator(CommConfig config, Transport* transport,
                           Inbox* inbox)
    : config_(std::move(config)), transport_(transport), inbox_(inbox) {
  absl::MutexLock lock(&op_mu_);
  next_op_seq_ = config_.first_op_seq;
}

uint64_t Communicator::next_op_seq() {
  absl::MutexLock lock(&op_mu_);
  return next_op_seq_;
}

void Communicator::set_next_op_seq(uint64_t seq) {
  absl::MutexLock lock(&op_mu_);
  next_op_seq_ = seq;
}

void Communicator::InheritTelemetry(const Communicator& previous) {
  Telemetry t;
  EdgeWindow w = [&] {
    absl::MutexLock lock(&previous.state_mu_);
    t = previous.telemetry_;
    return previous.window_;
  }();
  absl::MutexLock lock(&state_mu_);
  telemetry_ = std::move(t);
  window_ = std::move(w);
}

bool Communicator::AbortIfUntouched(absl::Status status) {
  {
    absl::MutexLock lock(&state_mu_);
    if (!progress_.busy || touched_) return false;
    untouched_abort_ = status;
  }
  inbox_->Interrupt(std::move(status));
  return true;
}

Communicator::~Communicator() = default;

absl::StatusOr<OpResult> Communicator::AllReduce(void* data, size_t count,
                                                 DType dtype, ReduceOp op,
                                                 absl::Duration timeout,
                                                 Algorithm algorithm) {
  if (data == nullptr && count > 0) {
    return absl::InvalidArgumentError("all_reduce: null buffer");
  }
  HostOpBuffer buffer(data);
  return AllReduce(buffer, count, dtype, op, timeout, algorithm);
}

absl::StatusOr<OpResult> Communicator::AllReduce(OpBuffer& buffer,
                                                 size_t count, DType dtype,
                                                 ReduceOp op,
                                                 absl::Duration timeout,
                                                 Algorithm algorithm) {
  if (!IsValidDType(static_cast<int>(dtype)) ||
      !IsValidReduceOp(static_cast<int>(op))) {
    return absl::InvalidArgumentError("all_reduce: invalid dtype or op");
  }
  Fingerprint fp;
  fp.kind = OpKind::kAllReduce;
  fp.dtype = dtype;
  fp.count = count;
  fp.op = op;
  fp.algorithm = algorithm;
  return Run(fp, &buffer, timeout);
}

absl::StatusOr<OpResult> Communicator::Broadcast(void* data, size_t count,
                                                 DType dtype, int root,
                                                 absl::Duration timeout) {
  if (data == nullptr && count > 0) {
    return absl::InvalidArgumentError("broadcast: null buffer");
  }
  HostOpBuffer buffer(data);
  return Broadcast(buffer, count, dtype, root, timeout);
}

absl::StatusOr<OpResult> Communicator::Broadcast(OpBuffer& buffer,
                                                 size_t count, DType dtype,
                                                 int root,
                                                 absl::Duration timeout) {
  if (!IsValidDType(static_cast<int>(dtype))) {
    return absl::InvalidArgumentError("broadcast: invalid dtype");
  }
  if (root < 0 || root >= config_.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "broadcast: root ", root, " is outside [0, ", config_.world_size,
        ")"));
  }
  Fingerprint fp;
  fp.kind = OpKind::kBroadcast;
  fp.dtype = dtype;
  fp.count = count;
  fp.root = root;
  return Run(fp, &buffer, timeout);
}

absl::StatusOr<OpResult> Communicator::Barrier(absl::Duration timeout) {
  Fingerprint fp;
  fp.kind = OpKind::kBarrier;
  HostOpBuffer none(nullptr);
  return Run(fp, &none, timeout);
}

void Communicator::Abort(absl::Status status) {
  inbox_->Interrupt(std::move(status));
}
void Communicator::ClearAbort() { inbox_->ClearInterrupt(); }

Progress Communicator::GetProgress() const {
  absl::MutexLock lock(&state_mu_);
  return progress_;
}

Telemetry Communicator::GetTelemetry() const {
  absl::MutexLock lock(&state_mu_);
  Telemetry t = telemetry_;
  t.window = window_.Summarize(absl::Now());
  t.window_seconds = absl::ToDoubleSeconds(window_.span());
  return t;
}

absl::Duration Communicator::RecordReduce(Op& op, int peer,
                                          absl::Duration spent) {
  if (config_.test_reduce_delay > absl::ZeroDuration()) {
    absl::SleepFor(config_.test_reduce_delay);
    spent += config_.test_reduce_delay;
  }
  op.edges.edges[peer].reduce_seconds += Seconds(spent);
  absl::MutexLock lock(&state_mu_);
  window_.RecordReduce(absl::Now(), peer, Seconds(spent));
  return spent;
}

std::string Communicator::Where(const Op& op) const {
  return absl::StrCat(Who(config_.rank), ": ", op.fp.ToString());
}

FrameMeta Communicator::FingerprintMeta(const Op& op) const {
  FrameMeta meta;
  meta.kind = FrameKind::kFingerprint;
  meta.generation = config_.generation;
  meta.op_seq = op.fp.op_seq;
  meta.phase = Phase::kFingerprint;
  meta.sender_rank = config_.rank;
  meta.origin_rank = config_.rank;
  meta.fingerprint = op.fp;
  meta.dtype = op.fp.dtype;
  return meta;
}

FrameMeta Communicator::DataMeta(const Op& op, Phase phase) const {
  FrameMeta meta;
  meta.kind = FrameKind::kData;
  meta.generation = config_.generation;
  meta.op_seq = op.fp.op_seq;
  meta.phase = phase;
  meta.dtype = op.fp.dtype;
  meta.op = op.fp.op;
  meta.sender_rank = config_.rank;
  return meta;
}

std::string Communicator::Who(int rank) const {
  if (rank >= 0 && rank < config_.world_size) {
    return DescribePeer(config_.members[static_cast<size_t>(rank)]);
  }
  absl::MutexLock lock(&state_mu_);
  const int shard = rank - config_.world_size;
  if (shard >= 0 && shard < static_cast<int>(servers_.size())) {
    const PeerInfo& s = servers_[static_cast<size_t>(shard)];
    return absl::StrCat("parameter server shard ", shard, " (", s.worker_id,
                        ", ", s.address, ")");
  }
  return absl::StrCat("rank ", rank);
}

void Communicator::SetServers(std::vector<PeerInfo> servers) {
  absl::MutexLock lock(&state_mu_);
  servers_ = std::move(servers);
}

void Communicator::SetLedger(Op& op, Phase phase, int step, int chunk,
                             int chunks, int awaited) {
  op.phase = phase;
  op.step = step;
  op.chunk = chunk;
  op.chunks = chunks;
  absl::MutexLock lock(&state_mu_);
  progress_.phase = phase;
  progress_.step = step;
  progress_.chunk = chunk;
  progress_.chunks = chunks;
  if (progress_.awaited_rank != awaited) {
    progress_.awaited_rank = awaited;
    progress_.waiting_since = absl::Now();
  }
}

absl::StatusOr<OpResult> Communicator::Run(const Fingerprint& fp_in,
                                           OpBuffer* buffer,
                                           absl::Duration timeout) {
  const uint64_t bytes = fp_in.count * DTypeSize(fp_in.dtype);
  if (fp_in.count > config_.max_op_bytes || bytes > config_.max_op_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        fp_in.ToString(), ": ", bytes, " bytes exceed this worker's limit of ",
        config_.max_op_bytes));
  }
  absl::MutexLock op_lock(&op_mu_);
  Op op;
  op.fp = fp_in;
  op.fp.op_seq = next_op_seq_;
  op.start = absl::Now();
  op.timeout = timeout > absl::ZeroDuration() ? timeout
                                              : config_.default_timeout;
  op.deadline = op.start + op.timeout;
  op.buf = buffer;
  const int g = config_.world_size;
  const int r = config_.rank;
  op.algorithm = Resolve(op.fp);
  op.all_to_all = g > 1 && g <= config_.all_to_all_max_world;
  if (op.all_to_all) {
    for (int k = 0; k < g; ++k) {
      if (k != r) op.watch.push_back(k);
    }
  } else if (g > 1) {
    op.watch = {Mod(r + 1, g), Mod(r - 1, g)};
  }
  if (op.algorithm == Algorithm::kParameterServer) {
    absl::MutexLock lock(&state_mu_);
    op.servers = static_cast<int>(servers_.size());
    for (int k = 0; k < op.servers; ++k) op.watch.push_back(g + k);
  }
  {
    absl::MutexLock lock(&op.sends->mu);
    op.sends->per_segment.assign(static_cast<size_t>(g), 0);
  }
  {
    absl::MutexLock lock(&state_mu_);
    progress_ = Progress();
    progress_.busy = true;
    progress_.op = op.fp.ToString();
    touched_ = false;
    untouched_abort_ = absl::OkStatus();
  }
  absl::Status status;
  if (op.fp.op_seq == 0 && g > 1) {
    // New in a running ring: take the number of the operation the others
    // are running (their fingerprints are on their way).
    absl::StatusOr<uint64_t> seq = inbox_->WaitFirstOpSeq(op.deadline);
    if (seq.ok()) {
      op.fp.op_seq = *seq;
    } else {
      status = absl::Status(
          seq.status().code(),
          absl::StrCat(Where(op), ": waiting for the ring's next operation: ",
                       seq.status().message()));
    }
  } else if (op.fp.op_seq == 0) {
    op.fp.op_seq = 1;
  }
  // A rank that could not adopt a number stays ready to adopt one.
  next_op_seq_ = op.fp.op_seq == 0 ? 0 : op.fp.op_seq + 1;
  {
    absl::MutexLock lock(&state_mu_);
    progress_.op = op.fp.ToString();
  }
  inbox_->DropBefore(op.fp.op_seq);
  inbox_->ClearLinkFailures();

  const bool eager = op.all_to_all && op.algorithm == Algorithm::kNaive &&
                     bytes > 0 && bytes <= config_.eager_bytes;
  if (status.ok()) {
    status = op.all_to_all ? ExchangeFingerprintsAllToAll(op, eager)
                           : ExchangeFingerprints(op);
  }
  bool untouched = !status.ok();
  {
    absl::MutexLock lock(&state_mu_);
    if (status.ok() && !untouched_abort_.ok()) {
      status = untouched_abort_;  // asked for before the buffer was touched
      untouched = true;
    }
    touched_ = status.ok();
  }
  if (status.ok()) status = op.buf->Begin(op.fp.dtype, op.fp.op, op.fp.count);
  if (status.ok()) {
    switch (op.fp.kind) {
      case OpKind::kAllReduce:
        status = op.algorithm == Algorithm::kNaive ? NaiveAllReduce(op)
                 : op.algorithm == Algorithm::kParameterServer
                     ? PsAllReduce(op)
                     : RingAllReduce(op);
        break;
      case OpKind::kBroadcast:
        status = ChainBroadcast(op);
        break;
      case OpKind::kBarrier:
        break;  // the fingerprint pass is the barrier
    }
  }
  {
    absl::Status ended = op.buf->End();
    if (status.ok()) status = ended;
  }
  if (!status.ok() && g > 1) SendAbort(op, status, op.abort_from);
  // On success the last frames are on their way to a live successor; on
  // failure nobody will read them, so give the wire a moment (for the
  // ABORT frames to healthy peers), not a deadline.
  WaitForReleases(op, -1, status.ok() ? op.deadline
                                      : absl::Now() + absl::Milliseconds(250));

  OpResult result;
  result.op_seq = op.fp.op_seq;
  result.algorithm = std::string(AlgorithmName(op.algorithm));
  result.bytes_sent = op.bytes_sent;
  result.bytes_received = op.bytes_received;
  result.elapsed = absl::Now() - op.start;
  result.generation = config_.generation;
  result.rank = config_.rank;
  result.world_size = config_.world_size;
  // A peer already at a later operation has finished every earlier one:
  // skip to it, so that the ranks number the next call alike again.
  next_op_seq_ = std::max(next_op_seq_, inbox_->MaxOpSeqSeen());
  {
    absl::MutexLock lock(&state_mu_);
    progress_ = Progress();
    for (auto& [peer, w] : op.waits) {
      EdgeStats& e = op.edges.edges[peer];
      e.wait_p50_seconds = Percentile(w, 0.50);
      e.wait_p99_seconds = Percentile(w, 0.99);
    }
    for (const auto& [peer, e] : op.edges.edges) {
      EdgeStats& t = telemetry_.edges_total[peer];
      t.bytes_sent += e.bytes_sent;
      t.bytes_received += e.bytes_received;
      t.send_seconds += e.send_seconds;
      t.wait_seconds += e.wait_seconds;
      t.reduce_seconds += e.reduce_seconds;
      t.chunks_received += e.chunks_received;
      t.errors += e.errors;
    }
    ++telemetry_.ops_by_label[{std::string(OpKindName(op.fp.kind)),
                               result.algorithm,
                               status.ok() ? "ok" : "error"}];
    if (telemetry_.latency_buckets.empty()) {
      telemetry_.latency_buckets.assign(kLatencyBounds.size(), 0);
    }
    const double secs = Seconds(result.elapsed);
    for (size_t i = 0; i < kLatencyBounds.size(); ++i) {
      if (secs <= kLatencyBounds[i]) {
        ++telemetry_.latency_buckets[i];
        break;
      }
    }
    telemetry_.latency_sum_seconds += secs;
    ++telemetry_.latency_count;
    op.edges.ops = 1;
    op.edges.op_seconds = Seconds(result.elapsed);
    window_.RecordOp(absl::Now(), Seconds(result.elapsed));
    telemetry_.last_op = std::move(op.edges);
    telemetry_.last_algorithm = result.algorithm;
    telemetry_.last_chunk_bytes = config_.chunk_bytes;
    telemetry_.last_op_bytes = bytes;
    telemetry_.bytes_sent += op.bytes_sent;
    telemetry_.bytes_received += op.bytes_received;
    if (status.ok()) {
      ++telemetry_.ops_completed;
    } else {
      ++telemetry_.ops_failed;
      telemetry_.last_error = std::string(status.message());
    }
  }
  if (!status.ok()) {
    if (untouched) {
      status.SetPayload(kUntouchedPayload,
                        absl::Cord(absl::StrCat(op.fp.op_seq)));
    }
    return status;
  }
  return result;
}

absl::Status Communicator::SendFrame(Op& op, int to, const FrameMeta& meta,
                                     const uint8_t* payload, size_t bytes,
                                     int segment) {
  std::shared_ptr<SendTracker> tracker = op.sends;
  {
    absl::MutexLock lock(&tracker->mu);
    ++tracker->total;
    if (segment >= 0) ++tracker->per_segment[static_cast<size_t>(segment)];
  }
  const absl::Time t0 = absl::Now();
  absl::Status s = transport_->Send(
      to, meta, absl::MakeConstSpan(payload, bytes), [tracker, segment] {
        absl::MutexLock lock(&tracker->mu);
        --tracker->total;
        if (segment >= 0) --tracker->per_segment[static_cast<size_t>(segment)];
      });
  const absl::Duration spent = absl::Now() - t0;
  {
    absl::MutexLock lock(&state_mu_);
    telemetry_.send_seconds += Seconds(spent);
    if (s.ok()) telemetry_.links[to].sent += bytes;
    const absl::Time now = absl::Now();
    if (s.ok()) {
      window_.RecordSend(now, to, bytes, Seconds(spent));
    } else {
      window_.RecordError(now, to);
    }
  }
  EdgeStats& edge = op.edges.edges[to];
  edge.send_seconds += Seconds(spent);
  if (s.ok()) {
    edge.bytes_sent += bytes;
  } else {
    ++edge.errors;
  }
  if (!s.ok()) {
    return absl::UnavailableError(absl::StrCat(
        Where(op), ": cannot send to ", Who(to),
        " in ", PhaseName(op.phase), " step ", op.step, ": ", s.message()));
  }
  op.bytes_sent += bytes;
  return absl::OkStatus();
}

bool Communicator::WaitForReleases(Op& op, int segment, absl::Time deadline) {
  SendTracker* t = op.sends.get();
  auto released = [t, segment]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(t->mu) {
    return segment < 0 ? t->total == 0
                       : t->per_segment[static_cast<size_t>(segment)] == 0;
  };
  {
    absl::MutexLock lock(&t->mu);
    if (t->mu.AwaitWithDeadline(absl::Condition(&released), deadline)) {
      return true;
    }
  }
  // A peer that stopped reading still holds frames that point into the
  // caller's buffer. Cancelling the links releases them at once; the buffer
  // must not be handed back before that.
  const int g = config_.world_size;
  transport_->Reset(Mod(config_.rank + 1, g));
  transport_->Reset(Mod(config_.rank - 1, g));
  absl::MutexLock lock(&t->mu);
  t->mu.Await(absl::Condition(&released));
  return false;
}

void Communicator::SendAbort(Op& op, const absl::Status& status,
                             int skip_rank) {
  FrameMeta meta;
  meta.kind = FrameKind::kAbort;
  meta.generation = config_.generation;
  meta.op_seq = op.fp.op_seq;
  meta.sender_rank = config_.rank;
  meta.origin_rank = config_.rank;
  meta.abort_code = status.code();
  meta.message = std::string(status.message());
  const int g = config_.world_size;
  std::vector<int> targets;
  if (op.all_to_all) {
    targets = op.watch;
  } else {
    targets = {Mod(config_.rank + 1, g)};
    if (g > 2) targets.push_back(Mod(config_.rank - 1, g));
  }
  for (int k = 0; k < op.servers; ++k) targets.push_back(g + k);
  for (int to : targets) {
    if (to == skip_rank || to == config_.rank) continue;
    // Best effort: a broken link cannot carry the news, and the other
    // direction around the ring does.
    transport_->Send(to, meta, {}, [] {}).IgnoreError();
  }
}

absl::StatusOr<InFrame> Communicator::Await(Op& op, int from,
                                            const std::string& detail) {
  SetLedger(op, op.phase, op.step, op.chunk, op.chunks, from);
  const absl::Time t0 = absl::Now();
  Inbox::Event ev = inbox_->Next(from, op.fp.op_seq, op.watch, op.deadline);
  const absl::Time t1 = absl::Now();
  const double waited = Seconds(t1 - t0);
  {
    absl::MutexLock lock(&state_mu_);
    telemetry_.wait_seconds += waited;
    if (ev.type == Inbox::Event::kFrame) {
      window_.RecordWait(t1, from, ev.frame.PayloadBytes(), waited);
    } else if (ev.type == Inbox::Event::kLinkFailed) {
      window_.RecordError(t1, ev.peer);
    }
  }
  if (ev.type == Inbox::Event::kFrame) {
    EdgeStats& e = op.edges.edges[from];
    e.wait_seconds += waited;
    e.bytes_received += ev.frame.PayloadBytes();
    ++e.chunks_received;
    op.waits[from].push_back(waited);
  } else if (ev.type == Inbox::Event::kLinkFailed) {
    ++op.edges.edges[ev.peer].errors;
  }
  const std::string where =
      absl::StrFormat("%s step %d, chunk %d of %d", PhaseName(op.phase),
                      op.step, op.chunk + 1, std::max(op.chunks, 1));
  switch (ev.type) {
    case Inbox::Event::kFrame: {
      const size_t bytes = ev.frame.PayloadBytes();
      op.bytes_received += bytes;
      absl::MutexLock lock(&state_mu_);
      telemetry_.links[from].received += bytes;
      return std::move(ev.frame);
    }
    case Inbox::Event::kAbort: {
      op.abort_from = ev.frame.meta.sender_rank;
      absl::StatusCode code = ev.frame.meta.abort_code;
      if (code == absl::StatusCode::kOk) code = absl::StatusCode::kAborted;
      return absl::Status(code, absl::StrCat(Where(op), ": aborted in ", where,
                                             " because ",
                                             ev.frame.meta.message));
    }
    case Inbox::Event::kLinkFailed:
      return absl::UnavailableError(absl::StrCat(
          Where(op), ": link with ", Who(ev.peer),
          " broke in ", where, ": ", ev.status.message()));
    case Inbox::Event::kInterrupted:
      return absl::Status(ev.status.code(),
                          absl::StrCat(Where(op), ": interrupted in ", where,
                                       ": ", ev.status.message()));
    case Inbox::Event::kTimeout:
      break;
  }
  return absl::DeadlineExceededError(absl::StrCat(
      Where(op), ": deadline of ", absl::FormatDuration(op.timeout),
      " exceeded waiting for ", Who(from), " in ", where,
      detail.empty() ? "" : " (", detail, detail.empty() ? "" : ")"));
}

absl::Status Communicator::CheckData(Op& op, const InFrame& frame, int from,
                                     const FrameMeta& expect) {
  const FrameMeta& m = frame.meta;
  const size_t bytes = static_cast<size_t>(expect.count) *
                       DTypeSize(op.fp.dtype);
  if (m.kind != FrameKind::kData || m.generation != config_.generation ||
      m.phase != expect.phase || m.step != expect.step ||
      m.segment != expect.segment || m.offset != expect.offset ||
      m.count != expect.count || m.dtype != op.fp.dtype ||
      frame.PayloadBytes() != bytes) {
    return absl::DataLossError(absl::StrFormat(
        "%s: corrupt frame from %s: expected generation %d %s step %d "
        "segment %d offset %d count %d (%d bytes), got generation %d %s "
        "step %d segment %d offset %d count %d (%d bytes)",
        Where(op), Who(from), config_.generation,
        PhaseName(expect.phase), expect.step, expect.segment, expect.offset,
        expect.count, bytes, m.generation, PhaseName(m.phase), m.step,
        m.segment, m.offset, m.count, frame.PayloadBytes()));
  }
  return absl::OkStatus();
}

absl::Status Communicator::ExchangeFingerprints(Op& op) {
  const int g = config_.world_size;
  const int r = config_.rank;
  if (g == 1) return absl::OkStatus();
  const int succ = Mod(r + 1, g);
  const int pred = Mod(r - 1, g);
  std::vector<Fingerprint> all(static_cast<size_t>(g));
  all[static_cast<size_t>(r)] = op.fp;
  FrameMeta meta = FingerprintMeta(op);
  SetLedger(op, Phase::kFingerprint, 0, 0, 1, -1);
  HALKA_RETURN_IF_ERROR(SendFrame(op, succ, meta, nullptr, 0, -1));
  for (int s = 0; s < g - 1; ++s) {
    SetLedger(op, Phase::kFingerprint, s, 0, 1, pred);
    const int origin = Mod(r - 1 - s, g);
    HALKA_ASSIGN_OR_RETURN(
        InFrame in,
        Await(op, pred,
              s == 0 ? std::string()
                     : absl::StrCat(
                           "it forwards the fingerprint of ",
                           Who(origin),
                           ", which has not arrived")));
    if (in.meta.kind != FrameKind::kFingerprint ||
        in.meta.origin_rank != origin || in.meta.step != s) {
      return absl::DataLossError(absl::StrCat(
          Where(op), ": expected the fingerprint of rank ", origin,
          " from ", Who(pred), " at step ", s,
          ", got a frame of kind ", static_cast<int>(in.meta.kind),
          " from origin ", in.meta.origin_rank));
    }
    all[static_cast<size_t>(origin)] = in.meta.fingerprint;
    if (s < g - 2) {
      FrameMeta fwd = in.meta;
      fwd.sender_rank = r;
      fwd.step = s + 1;
      HALKA_RETURN_IF_ERROR(SendFrame(op, succ, fwd, nullptr, 0, -1));
    }
  }
  return CheckFingerprints(op, all);
}

absl::Status Communicator::CheckFingerprints(
    Op& op, const std::vector<Fingerprint>& all) {
  const int g = config_.world_size;
  // Every rank holds the same list, so every rank reaches the same verdict
  // and names the same pair.
  for (int i = 1; i < g; ++i) {
    if (all[static_cast<size_t>(i)] != all[0]) {
      return absl::FailedPreconditionError(absl::StrCat(
          Where(op), ": ranks disagree on the operation: ",
          DescribePeer(config_.members[0]), " calls ", all[0].ToString(),
          " but ", Who(i),
          " calls ", all[static_cast<size_t>(i)].ToString()));
    }
  }
  return absl::OkStatus();
}

Algorithm Communicator::Resolve(const Fingerprint& fp) const {
  if (fp.kind != OpKind::kAllReduce) return Algorithm::kRing;
  if (fp.algorithm != Algorithm::kAuto) return fp.algorithm;
  const uint64_t bytes = fp.count * DTypeSize(fp.dtype);
  const int g = config_.world_size;
  return g <= config_.all_to_all_max_world && bytes <= config_.eager_bytes
             ? Algorithm::kNaive
             : Algorithm::kRing;
}

absl::Status Communicator::ExchangeFingerprintsAllToAll(Op& op, bool eager) {
  const int g = config_.world_size;
  const int r = config_.rank;
  const size_t bytes =
      static_cast<size_t>(op.fp.count) * DTypeSize(op.fp.dtype);
  FrameMeta meta = FingerprintMeta(op);
  meta.count = eager ? op.fp.count : 0;
  SetLedger(op, Phase::kFingerprint, 0, 0, 1, -1);
  const uint8_t* payload = nullptr;
  if (eager) {
    HALKA_ASSIGN_OR_RETURN(payload, op.buf->HostView(0, op.fp.count));
  }
  // Start with the successor, so the ring's first link is warm first.
  for (int i = 1; i < g; ++i) {
    const int to = Mod(r + i, g);
    HALKA_RETURN_IF_ERROR(
        SendFrame(op, to, meta, payload, eager ? bytes : 0, -1));
  }
  std::vector<Fingerprint> all(static_cast<size_t>(g));
  all[static_cast<size_t>(r)] = op.fp;
  if (eager) op.eager.resize(static_cast<size_t>(g));
  for (int i = 1; i < g; ++i) {
    const int from = Mod(r - i, g);
    HALKA_ASSIGN_OR_RETURN(InFrame in, Await(op, from, "its fingerprint"));
    if (in.meta.kind != FrameKind::kFingerprint ||
        in.meta.origin_rank != from) {
      return absl::DataLossError(absl::StrCat(
          Where(op), ": expected the fingerprint of ",
          Who(from),
          ", got a frame of kind ", static_cast<int>(in.meta.kind),
          " from origin ", in.meta.origin_rank));
    }
    all[static_cast<size_t>(from)] = in.meta.fingerprint;
    if (eager) op.eager[static_cast<size_t>(from)] = std::move(in);
  }
  HALKA_RETURN_IF_ERROR(CheckFingerprints(op, all));
  if (eager) {
    for (int k = 0; k < g; ++k) {
      if (k == r) continue;
      const InFrame& f = op.eager[static_cast<size_t>(k)];
      if (f.PayloadBytes() != bytes || f.meta.dtype != op.fp.dtype) {
        return absl::DataLossError(absl::StrCat(
            Where(op), ": the eager payload of ",
            Who(k), " has ",
            f.PayloadBytes(), " bytes, expected ", bytes));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Communicator::NaiveAllReduce(Op& op) {
  const int g = config_.world_size;
  const int r = config_.rank;
  const DType dt = op.fp.dtype;
  const size_t es = DTypeSize(dt);
  const size_t count = static_cast<size_t>(op.fp.count);
  if (g == 1 || count == 0) return absl::OkStatus();
  const bool eager = !op.eager.empty();
  // This rank's own contribution, readable on the host for the whole
  // operation (it is only overwritten at the end).
  HALKA_ASSIGN_OR_RETURN(const uint8_t* own, op.buf->HostView(0, count));
  const std::vector<Range> cs =
      eager ? std::vector<Range>{Range{0, count}}
            : PlanChunks(Range{0, count},
                         std::max<size_t>(1, config_.chunk_bytes / es));
  FrameMeta meta = DataMeta(op, Phase::kNaive);
  if (!eager) {
    for (size_t ci = 0; ci < cs.size(); ++ci) {
      for (int i = 1; i < g; ++i) {
        FrameMeta m = meta;
        m.step = 0;
        m.offset = cs[ci].offset;
        m.count = cs[ci].count;
        HALKA_RETURN_IF_ERROR(SendFrame(op, Mod(r + i, g), m,
                                        own + cs[ci].offset * es,
                                        cs[ci].count * es, -1));
      }
    }
  }
  // Reduce all G copies in rank order into scratch, so that every rank
  // computes the same bits; the own buffer is still being sent from.
  std::vector<uint8_t> scratch(count * es);
  absl::Duration reduce_time;
  for (size_t ci = 0; ci < cs.size(); ++ci) {
    const Range& c = cs[ci];
    uint8_t* dst = scratch.data() + c.offset * es;
    for (int k = 0; k < g; ++k) {
      const bool reduce = k > 0;
      SetLedger(op, Phase::kNaive, 0, static_cast<int>(ci),
                static_cast<int>(cs.size()), k == r ? -1 : k);
      if (k == r) {
        const absl::Time t0 = absl::Now();
        if (reduce) {
          ReduceInto(dt, op.fp.op, dst, own + c.offset * es, c.count);
        } else {
          std::memcpy(dst, own + c.offset * es, c.count * es);
        }
        reduce_time += absl::Now() - t0;
        continue;
      }
      InFrame in;
      if (eager) {
        in = std::move(op.eager[static_cast<size_t>(k)]);
      } else {
        HALKA_ASSIGN_OR_RETURN(in, Await(op, k));
        FrameMeta expect;
        expect.phase = Phase::kNaive;
        expect.step = 0;
        expect.segment = 0;
        expect.offset = c.offset;
        expect.count = c.count;
        HALKA_RETURN_IF_ERROR(CheckData(op, in, k, expect));
      }
      const absl::Time t0 = absl::Now();
      ApplyPayload(dt, op.fp.op, reduce, dst, in);
      reduce_time += RecordReduce(op, k, absl::Now() - t0);
    }
  }
  if (op.fp.op == ReduceOp::kAvg) FinalizeAvg(dt, scratch.data(), count, g);
  if (!WaitForReleases(op, -1, op.deadline)) {
    return absl::DeadlineExceededError(absl::StrCat(
        Where(op), ": deadline exceeded before the peers took this rank's "
                   "buffer"));
  }
  HALKA_RETURN_IF_ERROR(op.buf->WriteBack(scratch.data(), 0, count));
  absl::MutexLock lock(&state_mu_);
  telemetry_.reduce_seconds += Seconds(reduce_time);
  return absl::OkStatus();
}

absl::Status Communicator::PsAllReduce(Op& op) {
  const int g = config_.world_size;
  const int r = config_.rank;
  const int k_servers = op.servers;
  if (k_servers == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        Where(op), ": no parameter server is known for this job"));
  }
  const DType dt = op.fp.dtype;
  const size_t es = DTypeSize(dt);
  const size_t chunk_elems = std::max<size_t>(1, config_.chunk_bytes / es);
  const std::vector<Range> shards = PlanSegments(op.fp.count, k_servers);
  std::vector<std::vector<Range>> chunks;
  size_t total_chunks = 0;
  for (const Range& s : shards) {
    chunks.push_back(PlanChunks(s, chunk_elems));
    total_chunks += chunks.back().size();
  }
  {
    absl::MutexLock lock(&op.sends->mu);
    op.sends->per_segment.assign(std::max<size_t>(total_chunks, 1), 0);
  }
  FrameMeta fpm = FingerprintMeta(op);
  FrameMeta meta = DataMeta(op, Phase::kPsPush);
  // Push every chunk to its shard at once (the wire paces it), then take
  // the results back in order.
  size_t idx = 0;
  for (int k = 0; k < k_servers; ++k) {
    HALKA_RETURN_IF_ERROR(SendFrame(op, g + k, fpm, nullptr, 0, -1));
    for (const Range& c : chunks[static_cast<size_t>(k)]) {
      FrameMeta m = meta;
      m.phase = Phase::kPsPush;
      m.segment = k;
      m.offset = c.offset;
      m.count = c.count;
      HALKA_ASSIGN_OR_RETURN(const uint8_t* p, op.buf->HostView(c.offset, c.count));
      HALKA_RETURN_IF_ERROR(
          SendFrame(op, g + k, m, p, c.count * es, static_cast<int>(idx++)));
    }
  }
  idx = 0;
  for (int k = 0; k < k_servers; ++k) {
    const auto& cs = chunks[static_cast<size_t>(k)];
    for (size_t ci = 0; ci < cs.size(); ++ci, ++idx) {
      const Range& c = cs[ci];
      SetLedger(op, Phase::kPsPull, k, static_cast<int>(ci),
                static_cast<int>(cs.size()), g + k);
      HALKA_ASSIGN_OR_RETURN(InFrame in, Await(op, g + k));
      FrameMeta expect;
      expect.phase = Phase::kPsPull;
      expect.step = 0;
      expect.segment = k;
      expect.offset = c.offset;
      expect.count = c.count;
      HALKA_RETURN_IF_ERROR(CheckData(op, in, g + k, expect));
      if (!WaitForReleases(op, static_cast<int>(idx), op.deadline)) {
        return absl::DeadlineExceededError(absl::StrCat(
            Where(op), ": deadline exceeded before ", Who(g + k),
            " took this rank's chunk at offset ", c.offset));
      }
      HALKA_RETURN_IF_ERROR(op.buf->Apply(/*reduce=*/false, c.offset, c.count, in));
    }
  }
  return absl::OkStatus();
}

absl::Status Communicator::RingAllReduce(Op& op) {
  const int g = config_.world_size;
  const int r = config_.rank;
  const DType dt = op.fp.dtype;
  const size_t es = DTypeSize(dt);
  if (g == 1 || op.fp.count == 0) return absl::OkStatus();
  const int succ = Mod(r + 1, g);
  const int pred = Mod(r - 1, g);
  const size_t chunk_elems = std::max<size_t>(1, config_.chunk_bytes / es);
  const std::vector<Range> segments = PlanSegments(op.fp.count, g);
  std::vector<std::vector<Range>> chunks(static_cast<size_t>(g));
  for (int i = 0; i < g; ++i) {
    chunks[static_cast<size_t>(i)] =
        PlanChunks(segments[static_cast<size_t>(i)], chunk_elems);
  }
  FrameMeta meta = DataMeta(op, Phase::kReduceScatter);

  auto send_chunk = [&](Phase phase, int step, int seg,
                        const Range& c) -> absl::Status {
    FrameMeta m = meta;
    m.phase = phase;
    m.step = step;
    m.segment = seg;
    m.offset = c.offset;
    m.count = c.count;
    absl::StatusOr<const uint8_t*> p = op.buf->HostView(c.offset, c.count);
    if (!p.ok()) return p.status();
    return SendFrame(op, succ, m, *p, c.count * es, seg);
  };

  // Total steps: G-1 reduce-scatter then G-1 all-gather, numbered 0..2G-3.
  // Step t sends the segment received (and reduced) at step t-1, chunk by
  // chunk, so a chunk moves on as soon as it is ready.
  const int total_steps = 2 * (g - 1);
  auto phase_of = [g](int t) {
    return t < g - 1 ? Phase::kReduceScatter : Phase::kAllGather;
  };
  auto step_in_phase = [g](int t) { return t < g - 1 ? t : t - (g - 1); };
  auto send_seg = [g, r](int t) {
    return t < g - 1 ? RsSendSegment(r, g, t) : AgSendSegment(r, g, t - (g - 1));
  };
  auto recv_seg = [g, r](int t) {
    return t < g - 1 ? RsRecvSegment(r, g, t) : AgRecvSegment(r, g, t - (g - 1));
  };

  // Step 0 sends this rank's own data.
  {
    const int seg = send_seg(0);
    const auto& cs = chunks[static_cast<size_t>(seg)];
    SetLedger(op, Phase::kReduceScatter, 0, 0, static_cast<int>(cs.size()),
              -1);
    for (const Range& c : cs) {
      HALKA_RETURN_IF_ERROR(send_chunk(Phase::kReduceScatter, 0, seg, c));
    }
  }
  absl::Duration reduce_time;
  for (int t = 0; t < total_steps; ++t) {
    const Phase phase = phase_of(t);
    const int step = step_in_phase(t);
    const int seg = recv_seg(t);
    const bool reduce = phase == Phase::kReduceScatter;
    const bool last_rs = t == g - 2;
    const auto& cs = chunks[static_cast<size_t>(seg)];
    if (!reduce && !WaitForReleases(op, seg, op.deadline)) {
      // Never overwrite memory the wire may still be reading.
      return absl::DeadlineExceededError(absl::StrCat(
          Where(op), ": deadline exceeded waiting for ",
          Who(succ), " to take segment ", seg,
          " before all-gather step ", step));
    }
    for (size_t ci = 0; ci < cs.size(); ++ci) {
      const Range& c = cs[ci];
      SetLedger(op, phase, step, static_cast<int>(ci),
                static_cast<int>(cs.size()), pred);
      HALKA_ASSIGN_OR_RETURN(InFrame in, Await(op, pred));
      FrameMeta expect;
      expect.phase = phase;
      expect.step = step;
      expect.segment = seg;
      expect.offset = c.offset;
      expect.count = c.count;
      HALKA_RETURN_IF_ERROR(CheckData(op, in, pred, expect));
      const absl::Time t0 = absl::Now();
      HALKA_RETURN_IF_ERROR(op.buf->Apply(reduce, c.offset, c.count, in));
      if (last_rs && op.fp.op == ReduceOp::kAvg) {
        // The owner divides once, before the all-gather, so every rank
        // receives the same bits.
        HALKA_RETURN_IF_ERROR(op.buf->FinalizeAvg(c.offset, c.count, g));
      }
      reduce_time += RecordReduce(op, pred, absl::Now() - t0);
      if (t + 1 < total_steps) {
        HALKA_RETURN_IF_ERROR(
            send_chunk(phase_of(t + 1), step_in_phase(t + 1), seg, c));
      }
    }
  }
  {
    absl::MutexLock lock(&state_mu_);
    telemetry_.reduce_seconds += Seconds(reduce_time);
  }
  return absl::OkStatus();
}

absl::Status Communicator::ChainBroadcast(Op& op) {
  const int g = config_.world_size;
  const int r = config_.rank;
  const int root = op.fp.root;
  if (g == 1 || op.fp.count == 0) return absl::OkStatus();
  const DType dt = op.fp.dtype;
  const size_t es = DTypeSize(dt);
  const int succ = Mod(r + 1, g);
  const int pred = Mod(r - 1, g);
  const size_t chunk_elems = std::max<size_t>(1, config_.chunk_bytes / es);
  const std::vector<Range> cs =
      PlanChunks(Range{0, static_cast<size_t>(op.fp.count)}, chunk_elems);
  // Data flows root -> root+1 -> ... -> root-1; step = distance from root.
  const int distance = Mod(r - root, g);
  const bool forward = succ != root;
  FrameMeta meta = DataMeta(op, Phase::kBroadcast);
  for (size_t ci = 0; ci < cs.size(); ++ci) {
    const Range& c = cs[ci];
    SetLedger(op, Phase::kBroadcast, distance, static_cast<int>(ci),
              static_cast<int>(cs.size()), r == root ? -1 : pred);
    if (r != root) {
      HALKA_ASSIGN_OR_RETURN(InFrame in, Await(op, pred));
      FrameMeta expect;
      expect.phase = Phase::kBroadcast;
      expect.step = distance - 1;
      expect.segment = 0;
      expect.offset = c.offset;
      expect.count = c.count;
      HALKA_RETURN_IF_ERROR(CheckData(op, in, pred, expect));
      HALKA_RETURN_IF_ERROR(op.buf->Apply(/*reduce=*/false, c.offset, c.count, in));
    }
    if (forward) {
      FrameMeta m = meta;
      m.step = distance;
      m.segment = 0;
      m.offset = c.offset;
      m.count = c.count;
      HALKA_ASSIGN_OR_RETURN(const uint8_t* p, op.buf->HostView(c.offset, c.count));
      HALKA_RETURN_IF_ERROR(SendFrame(op, succ, m, p,
                                      c.count * es, 0));
    }
  }
  return absl::OkStatus();
}

}  // namespace halka
