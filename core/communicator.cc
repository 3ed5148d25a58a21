// The Communicator's public calls and the life of one operation. The
// operation's I/O lives in op_context.cc, the collectives in algorithms/,
// the numbering in op_numbering.cc, the counters in telemetry.cc.
#include "core/communicator.h"

#include <optional>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "core/algorithms/algorithms.h"
#include "core/status_macros.h"

namespace halka {

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
  telemetry_.InheritFrom(previous.telemetry_);
}

bool Communicator::AbortIfUntouched(absl::Status status) {
  if (!progress_.RequestUntouchedAbort(status)) return false;
  // This operation only: a group's running on the same links may be past
  // that point (core/sub_ring.h).
  inbox_->Interrupt(std::move(status), /*groups=*/false);
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
  if (absl::Status s = CheckReduction(dtype, op); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("all_reduce: ", s.message()));
  }
  Fingerprint fp;
  fp.kind = OpKind::kAllReduce;
  fp.dtype = dtype;
  fp.count = count;
  fp.op = op;
  fp.algorithm = algorithm;
  return Run(fp, &buffer, timeout);
}

namespace {

// The largest send scratch an operation leaves to the next (spare_scratch_):
// a recursive doubling's two halves up to 512 KiB, a tree's buffer up to
// 1 MiB, a two-level all-reduce's copy where it starts early (up to 8 MiB
// with hosts 2 ms apart: TwoLevelCanStartEarly). The operations it serves
// would otherwise allocate, fault in and free it each time.
constexpr size_t kKeptScratchBytes = size_t{8} << 20;

// Which algorithms a collective of `kind` implements (auto always).
bool Implements(OpKind kind, Algorithm algorithm) {
  if (algorithm == Algorithm::kAuto) return true;
  switch (kind) {
    case OpKind::kAllGather:
    case OpKind::kReduceScatter:
      return algorithm == Algorithm::kRing ||
             algorithm == Algorithm::kTwoLevel;
    case OpKind::kReduce:
      return algorithm == Algorithm::kRing || algorithm == Algorithm::kNaive;
    case OpKind::kBroadcast:
      return algorithm == Algorithm::kRing || algorithm == Algorithm::kTree;
    case OpKind::kGather:
    case OpKind::kScatter:
    case OpKind::kAllToAll:
      return algorithm == Algorithm::kNaive;
    default:
      return true;
  }
}

}  // namespace

absl::StatusOr<OpResult> Communicator::Broadcast(void* data, size_t count,
                                                 DType dtype, int root,
                                                 absl::Duration timeout,
                                                 Algorithm algorithm) {
  if (data == nullptr && count > 0) {
    return absl::InvalidArgumentError("broadcast: null buffer");
  }
  HostOpBuffer buffer(data);
  return Broadcast(buffer, count, dtype, root, timeout, algorithm);
}

absl::StatusOr<OpResult> Communicator::Broadcast(OpBuffer& buffer,
                                                 size_t count, DType dtype,
                                                 int root,
                                                 absl::Duration timeout,
                                                 Algorithm algorithm) {
  if (!IsValidDType(static_cast<int>(dtype))) {
    return absl::InvalidArgumentError("broadcast: invalid dtype");
  }
  if (!Implements(OpKind::kBroadcast, algorithm)) {
    return Refuse(absl::UnimplementedError(absl::StrCat(
                      "broadcast: the ", AlgorithmName(algorithm),
                      " algorithm does not implement it; use auto, ring "
                      "(the chain) or tree")),
                  timeout);
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
  fp.algorithm = algorithm;
  return Run(fp, &buffer, timeout);
}

absl::Status Communicator::Refuse(absl::Status refused,
                                  absl::Duration timeout) {
  SkipOp(next_op_seq(), refused,
         halka::Now() + (timeout > absl::ZeroDuration() ? timeout
                                                       : config_.default_timeout))
      .IgnoreError();  // the refusal is the caller's answer either way
  return refused;
}

absl::StatusOr<Fingerprint> Communicator::SliceOpFingerprint(
    OpKind kind, size_t whole, size_t slice, DType dtype, Algorithm algorithm,
    absl::Duration timeout, int input_slice) {
  const absl::string_view name = OpKindName(kind);
  const size_t g = static_cast<size_t>(config_.world_size);
  // Which count is the whole buffer (world x slice): the result of an
  // all-gather or gather, the input of a reduce-scatter or scatter.
  const bool whole_is_recv =
      kind == OpKind::kAllGather || kind == OpKind::kGather;
  absl::Status refused;
  if (!IsValidDType(static_cast<int>(dtype))) {
    refused = absl::InvalidArgumentError(absl::StrCat(name, ": invalid dtype"));
  } else if (!Implements(kind, algorithm)) {
    refused = absl::UnimplementedError(absl::StrCat(
        name, ": the ", AlgorithmName(algorithm),
        " algorithm does not implement it; use auto",
        Implements(kind, Algorithm::kTwoLevel)
            ? ", ring or two_level"
            : (Implements(kind, Algorithm::kRing) ? " or ring" : " or naive")));
  } else if (kind == OpKind::kAllToAll && whole % g != 0) {
    refused = absl::InvalidArgumentError(absl::StrCat(
        name, ": count ", whole, " must be a multiple of the ring's world (",
        g, "): one slice per rank"));
  } else if (kind != OpKind::kAllToAll && (whole % g != 0 || whole / g != slice)) {
    refused = absl::InvalidArgumentError(absl::StrCat(
        name, ": ", whole_is_recv ? "recv_count " : "send_count ", whole,
        " must be the ring's world (", g, ") x ",
        whole_is_recv ? "send_count " : "recv_count ", slice, " = ",
        g * slice));
  } else if (input_slice < 0 || static_cast<size_t>(input_slice) >= g) {
    refused = absl::InvalidArgumentError(absl::StrCat(
        name, ": input slice ", input_slice, " is outside [0, ", g, ")"));
  }
  if (!refused.ok()) return Refuse(std::move(refused), timeout);
  Fingerprint fp;
  fp.kind = kind;
  fp.dtype = dtype;
  fp.count = whole;
  fp.algorithm = algorithm;
  return fp;
}

absl::Status Communicator::CheckRoot(absl::string_view name, int root,
                                     absl::Duration timeout) {
  if (root >= 0 && root < config_.world_size) return absl::OkStatus();
  return Refuse(absl::InvalidArgumentError(absl::StrCat(
                    name, ": root ", root, " is outside [0, ",
                    config_.world_size, ")")),
                timeout);
}

absl::StatusOr<OpResult> Communicator::Reduce(OpBuffer& buffer, size_t count,
                                              DType dtype, ReduceOp op,
                                              int root, absl::Duration timeout,
                                              Algorithm algorithm) {
  absl::Status refused;
  if (!IsValidDType(static_cast<int>(dtype))) {
    refused = absl::InvalidArgumentError("reduce: invalid dtype");
  } else if (!IsValidReduceOp(static_cast<int>(op))) {
    refused = absl::InvalidArgumentError("reduce: invalid reduce op");
  } else if (absl::Status s = CheckReduction(dtype, op); !s.ok()) {
    refused = absl::InvalidArgumentError(absl::StrCat("reduce: ", s.message()));
  } else if (!Implements(OpKind::kReduce, algorithm)) {
    refused = absl::UnimplementedError(
        absl::StrCat("reduce: the ", AlgorithmName(algorithm),
                     " algorithm does not implement it; use auto, ring or "
                     "naive"));
  }
  if (!refused.ok()) return Refuse(std::move(refused), timeout);
  HALKA_RETURN_IF_ERROR(CheckRoot("reduce", root, timeout));
  Fingerprint fp;
  fp.kind = OpKind::kReduce;
  fp.dtype = dtype;
  fp.count = count;
  fp.op = op;
  fp.root = root;
  fp.algorithm = algorithm;
  return Run(fp, &buffer, timeout);
}

absl::StatusOr<OpResult> Communicator::Gather(OpBuffer& buffer,
                                              size_t send_count,
                                              size_t recv_count,
                                              int input_slice, DType dtype,
                                              int root,
                                              absl::Duration timeout,
                                              Algorithm algorithm) {
  absl::StatusOr<Fingerprint> fp =
      SliceOpFingerprint(OpKind::kGather, recv_count, send_count, dtype,
                         algorithm, timeout, input_slice);
  if (!fp.ok()) return fp.status();
  HALKA_RETURN_IF_ERROR(CheckRoot("gather", root, timeout));
  fp->root = root;
  return Run(*fp, &buffer, timeout, input_slice);
}

absl::StatusOr<OpResult> Communicator::Scatter(OpBuffer& buffer,
                                               size_t send_count,
                                               size_t recv_count, DType dtype,
                                               int root,
                                               absl::Duration timeout,
                                               Algorithm algorithm) {
  absl::StatusOr<Fingerprint> fp =
      SliceOpFingerprint(OpKind::kScatter, send_count, recv_count, dtype,
                         algorithm, timeout, /*input_slice=*/0);
  if (!fp.ok()) return fp.status();
  HALKA_RETURN_IF_ERROR(CheckRoot("scatter", root, timeout));
  fp->root = root;
  return Run(*fp, &buffer, timeout);
}

absl::StatusOr<OpResult> Communicator::AllToAll(OpBuffer& buffer,
                                                size_t count, DType dtype,
                                                absl::Duration timeout,
                                                Algorithm algorithm) {
  absl::StatusOr<Fingerprint> fp =
      SliceOpFingerprint(OpKind::kAllToAll, count, 0, dtype, algorithm,
                         timeout, /*input_slice=*/0);
  if (!fp.ok()) return fp.status();
  return Run(*fp, &buffer, timeout);
}

absl::StatusOr<OpResult> Communicator::AllGather(
    OpBuffer& buffer, size_t send_count, size_t recv_count, int input_slice,
    DType dtype, absl::Duration timeout, Algorithm algorithm) {
  absl::StatusOr<Fingerprint> fp =
      SliceOpFingerprint(OpKind::kAllGather, recv_count, send_count, dtype,
                         algorithm, timeout, input_slice);
  if (!fp.ok()) return fp.status();
  return Run(*fp, &buffer, timeout, input_slice);
}

absl::StatusOr<OpResult> Communicator::ReduceScatter(
    OpBuffer& buffer, size_t send_count, size_t recv_count, DType dtype,
    ReduceOp op, absl::Duration timeout, Algorithm algorithm) {
  if (!IsValidReduceOp(static_cast<int>(op))) {
    return absl::InvalidArgumentError("reduce_scatter: invalid reduce op");
  }
  if (absl::Status s = CheckReduction(dtype, op); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("reduce_scatter: ", s.message()));
  }
  absl::StatusOr<Fingerprint> fp =
      SliceOpFingerprint(OpKind::kReduceScatter, send_count, recv_count,
                         dtype, algorithm, timeout, /*input_slice=*/0);
  if (!fp.ok()) return fp.status();
  fp->op = op;
  return Run(*fp, &buffer, timeout);
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

Progress Communicator::GetProgress() const { return progress_.Get(); }

Telemetry Communicator::GetTelemetry() const {
  return telemetry_.Snapshot(halka::Now());
}

std::vector<TraceOp> Communicator::GetTrace() const {
  return telemetry_.Trace();
}

void Communicator::SetServers(std::vector<PeerInfo> servers) {
  absl::MutexLock lock(&servers_mu_);
  servers_ = std::move(servers);
}


namespace {

// Whether the ranks agree on op's fingerprint. Where the ring's or
// halving-doubling's first step can leave early, the buffer is begun
// (*begun: how that went) and the step sent between sending the
// fingerprints and waiting for them; where a
// two-level all-reduce can start early, its host's reduce-scatter runs
// there, in a copy (TwoLevelStartEarly).
absl::Status AgreeOnFingerprints(OpContext& op, const Fingerprint& fp,
                                 OpBuffer* buffer,
                                 std::optional<absl::Status>* begun) {
  // Recursive doubling's frames carry the fingerprints: its whole
  // exchange is the agreement (the buffer is written only afterwards).
  // The buffer is begun first (it is only read until every frame agreed).
  if (fp.kind == OpKind::kAllReduce &&
      op.algorithm() == Algorithm::kRecursiveDoubling) {
    *begun = buffer->Begin(fp.dtype, fp.op, fp.count);
    if (!(*begun)->ok()) return **begun;
    return DoublingExchange(op);
  }
  const bool ring_early = RingCanSendEarly(op);
  const bool halving_early = !ring_early && HalvingCanSendEarly(op);
  const bool two_level_early =
      !ring_early && !halving_early && TwoLevelCanStartEarly(op);
  if (!ring_early && !halving_early && !two_level_early) {
    return ExchangeFingerprints(op);
  }
  absl::Status status;
  {
    // The ring's and halving-doubling's first step only send: their frames
    // and the fingerprints leave together (a gRPC stream's first data
    // frame does not wait for the fingerprint's write to complete).
    // Two-level's early start waits for its host's frames: nothing held.
    // Nor for a device buffer, whose first step copies each chunk to the
    // host before it sends it: every frame would wait for the last copy.
    const bool hold = !two_level_early && buffer->in_host_memory();
    HeldWrites held(hold ? op.transport() : nullptr);
    status = SendFingerprints(op);
    if (status.ok()) *begun = buffer->Begin(fp.dtype, fp.op, fp.count);
    if (status.ok() && (*begun)->ok()) {
      status = ring_early      ? RingSendFirstStep(op)
               : halving_early ? HalvingSendFirstStep(op)
                               : TwoLevelStartEarly(op);
    }
  }
  if (status.ok()) status = AwaitFingerprints(op);
  return status;
}

}  // namespace

absl::StatusOr<OpResult> Communicator::Run(const Fingerprint& fp,
                                           OpBuffer* buffer,
                                           absl::Duration timeout,
                                           int input_slice) {
  const uint64_t bytes = fp.count * DTypeSize(fp.dtype);
  if (fp.count > config_.max_op_bytes || bytes > config_.max_op_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        fp.ToString(), ": ", bytes, " bytes exceed this worker's limit of ",
        config_.max_op_bytes));
  }
  absl::MutexLock op_lock(&op_mu_);
  const absl::Time start = halka::Now();
  const Algorithm algorithm = ResolveAlgorithm(config_, fp);
  Fingerprint numbered = fp;
  numbered.op_seq = next_op_seq_;
  const bool adopting = numbered.op_seq == 0;
  OpContext op(CommParts{&config_, transport_, inbox_, &telemetry_, &progress_},
               numbered, buffer, timeout, start, algorithm,
               ServersFor(algorithm));
  op.set_input_slice(input_slice);
  op.send_scratch().swap(spare_scratch_);
  telemetry_.BeginOp();
  // The operation's text, formatted once (again only when it adopts a
  // number): the progress ledger and the telemetry both keep it.
  std::string described = op.fp().ToString();
  progress_.Start(described);
  absl::Status status = AdoptOpSeq(op);
  // A rank that could not adopt a number stays ready to adopt one.
  next_op_seq_ = op.fp().op_seq == 0 ? 0 : op.fp().op_seq + 1;
  if (op.fp().op_seq != numbered.op_seq) {
    described = op.fp().ToString();
    progress_.Describe(described);
  }
  inbox_->DropBefore(op.fp().op_seq);
  inbox_->ClearLinkFailures();

  // The ring's first step needs no agreement to leave (it reads this rank's
  // own chunks only), nor does halving-doubling's where it reads only this
  // rank's input: it goes out between sending the fingerprints and waiting
  // for them, so the fingerprints' hop overlaps the data's. A failed Begin
  // is reported where it always was, after the fingerprints.
  std::optional<absl::Status> begun;
  if (status.ok()) status = AgreeOnFingerprints(op, fp, buffer, &begun);
  status = progress_.EndUntouched(std::move(status));
  const bool untouched = !status.ok();
  if (status.ok()) {
    status = begun.has_value() ? *begun
                               : buffer->Begin(fp.dtype, fp.op, fp.count);
  }
  if (status.ok()) status = RunAlgorithm(op);
  if (status.ok()) status = op.CheckIntact();
  absl::Status ended = buffer->End();
  if (status.ok()) status = ended;
  if (!status.ok() && config_.world_size > 1) {
    // Nobody will use this operation's frames that have not gone out: they
    // are dropped (one part way out is copied), so that the ABORT goes next
    // and not behind them, and a slow link need not be cut to free the
    // buffer (its peer would then see a broken link, not the cause).
    transport_->Withdraw(OpId{op.fp().op_seq});
    op.SendAbort(status);
  }
  // On success the last frames are on their way to a live successor; on
  // failure nobody will read them, so give the wire a moment (for the
  // ABORT frames to healthy peers), not a deadline; a link still holding
  // the buffer after that (a gRPC stream's write in flight) is cut.
  op.ReleaseEverything(status.ok() ? op.release_deadline()
                                    : halka::Now() + absl::Milliseconds(250));

  op.EndTrace();
  if (op.send_scratch().capacity() <= kKeptScratchBytes) {
    spare_scratch_.swap(op.send_scratch());
  }
  const uint64_t ran_as = op.fp().op_seq;
  const bool may_rerun = SettleNumber(op, adopting, &status);
  if (op.fp().op_seq != ran_as) described = op.fp().ToString();
  const absl::Duration elapsed = halka::Now() - start;
  const std::string algorithm_name(AlgorithmName(algorithm));
  const double model_seconds = ModelSeconds(config_, fp, algorithm);
  const LinkBytes moved = telemetry_.EndOp(
      halka::Now(), {fp.kind, algorithm_name, status, elapsed,
                    config_.chunk_bytes, bytes, config_.generation,
                    op.fp().op_seq, std::move(described), start,
                    op.fingerprint_end(), model_seconds});
  progress_.Finish();
  if (!status.ok()) {
    if (untouched && may_rerun) {
      status.SetPayload(kUntouchedPayload,
                        absl::Cord(absl::StrCat(op.fp().op_seq)));
    }
    return status;
  }
  OpResult result{/*op_seq=*/op.fp().op_seq, /*algorithm=*/algorithm_name,
                  /*bytes_sent=*/moved.sent,
                  /*bytes_received=*/moved.received, /*elapsed=*/elapsed,
                  /*generation=*/config_.generation, /*rank=*/config_.rank,
                  /*world_size=*/config_.world_size};
  result.model_seconds = model_seconds;
  return result;
}

std::vector<PeerInfo> Communicator::ServersFor(Algorithm algorithm) const {
  if (algorithm != Algorithm::kParameterServer) return {};
  absl::MutexLock lock(&servers_mu_);
  return servers_;
}

absl::Status Communicator::RunAlgorithm(OpContext& op) {
  switch (op.fp().kind) {
    case OpKind::kAllReduce:
      switch (op.algorithm()) {
        case Algorithm::kNaive:
          return NaiveAllReduce(op);
        case Algorithm::kParameterServer:
          return PsAllReduce(op);
        case Algorithm::kTwoLevel:
          return TwoLevelAllReduce(op);
        case Algorithm::kTree:
          return TreeAllReduce(op);
        case Algorithm::kRecursiveDoubling:
          return DoublingAllReduce(op);
        case Algorithm::kHalvingDoubling:
          return HalvingDoublingAllReduce(op);
        default:
          return RingAllReduce(op);
      }
    case OpKind::kBroadcast:
      return op.algorithm() == Algorithm::kTree ? TreeBroadcast(op)
                                                : ChainBroadcast(op);
    case OpKind::kAllGather:
      return op.algorithm() == Algorithm::kTwoLevel ? TwoLevelAllGather(op)
                                                    : RingAllGather(op);
    case OpKind::kReduceScatter:
      return op.algorithm() == Algorithm::kTwoLevel
                 ? TwoLevelReduceScatter(op)
                 : RingReduceScatter(op);
    case OpKind::kReduce:
      return RootedReduce(op);
    case OpKind::kGather:
      return DirectGather(op);
    case OpKind::kScatter:
      return DirectScatter(op);
    case OpKind::kAllToAll:
      return PairwiseAllToAll(op);
    case OpKind::kBarrier:
      break;  // the fingerprint pass is the barrier
    case OpKind::kSend:
    case OpKind::kRecv:
      return absl::InternalError("send/recv are not collectives");
  }
  return absl::OkStatus();
}

}  // namespace halka
