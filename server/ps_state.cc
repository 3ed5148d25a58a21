#include "server/ps_state.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/dtype.h"
#include "core/payload.h"
#include "core/reduce.h"
#include "core/ring_plan.h"

namespace halka {

PsState::PsState(int shard, int shards) : shard_(shard), shards_(shards) {}

void PsState::StreamOpened(int rank) { connected_.insert(rank); }

std::vector<PsSend> PsState::StreamClosed(int rank) {
  std::vector<PsSend> out;
  connected_.erase(rank);
  std::vector<uint64_t> pending;
  for (const auto& [seq, op] : ops_) pending.push_back(seq);
  for (uint64_t seq : pending) {
    FailOp(seq,
           absl::UnavailableError(absl::StrCat(
               "parameter server shard ", shard_, ": the stream of rank ",
               rank, " closed in the middle of the operation")),
           rank, out);
  }
  return out;
}

std::vector<int> PsState::Recipients(int world, int skip) const {
  std::vector<int> to;
  for (int rank : connected_) {
    if (rank != skip && rank < world) to.push_back(rank);
  }
  return to;
}

void PsState::FailOp(uint64_t op_seq, const absl::Status& status, int skip,
                     std::vector<PsSend>& out,
                     std::vector<int32_t> late_ranks) {
  auto it = ops_.find(op_seq);
  if (it == ops_.end()) return;
  PsSend send;
  FrameMeta& meta = send.meta;
  meta.kind = FrameKind::kAbort;
  meta.generation = it->second.generation;
  meta.op_seq = op_seq;
  meta.sender_rank = -1;
  meta.origin_rank = -1;
  meta.abort_code = status.code();
  meta.message = std::string(status.message());
  meta.late_ranks = std::move(late_ranks);
  send.to = Recipients(it->second.world, skip);
  out.push_back(std::move(send));
  ops_.erase(it);
  ++stats_.ops_failed;
}

std::vector<PsSend> PsState::OnFrame(int rank, int world, InFrame frame) {
  std::vector<PsSend> out;
  const FrameMeta& m = frame.meta;
  if (m.kind == FrameKind::kAbort) {
    FailOp(m.op_seq,
           absl::Status(m.abort_code == absl::StatusCode::kOk
                            ? absl::StatusCode::kAborted
                            : m.abort_code,
                        m.message),
           rank, out, m.late_ranks);
    return out;
  }
  auto [it, created] = ops_.try_emplace(m.op_seq);
  Op& op = it->second;
  if (created) {
    op.world = world;
    op.generation = m.generation;
    op.have_fp.assign(static_cast<size_t>(world), false);
  }
  if (rank >= op.world) {
    FailOp(m.op_seq,
           absl::DataLossError(absl::StrCat(
               "parameter server shard ", shard_, ": rank ", rank,
               " joined an operation of world size ", op.world)),
           -1, out);
    return out;
  }
  if (m.kind == FrameKind::kFingerprint) {
    OnFingerprint(rank, m, it, out);
  } else {
    OnData(rank, std::move(frame), it, out);
  }
  return out;
}

void PsState::OnFingerprint(int rank, const FrameMeta& m,
                            std::map<uint64_t, Op>::iterator it,
                            std::vector<PsSend>& out) {
  Op& op = it->second;
  const std::string who = absl::StrCat("parameter server shard ", shard_);
  if (op.have_fp[static_cast<size_t>(rank)]) {
    FailOp(m.op_seq, absl::DataLossError(absl::StrCat(
                         who, ": a second fingerprint from rank ", rank)),
           -1, out);
    return;
  }
  if (op.fp_rank < 0) {
    op.fp = m.fingerprint;
    op.fp_rank = rank;
    const std::vector<Range> parts = PlanSegments(op.fp.count, shards_);
    op.shard_offset = parts[static_cast<size_t>(shard_)].offset;
    op.shard_count = parts[static_cast<size_t>(shard_)].count;
  } else if (m.fingerprint != op.fp) {
    FailOp(m.op_seq,
           absl::FailedPreconditionError(absl::StrCat(
               who, ": ranks disagree on the operation: rank ", op.fp_rank,
               " calls ", op.fp.ToString(), " but rank ", rank, " calls ",
               m.fingerprint.ToString())),
           -1, out);
    return;
  }
  op.have_fp[static_cast<size_t>(rank)] = true;
  ++op.fps;
  if (op.fps == op.world && op.shard_count == 0) {
    ops_.erase(it);
    ++stats_.ops_completed;
  }
}

void PsState::OnData(int rank, InFrame frame,
                     std::map<uint64_t, Op>::iterator it,
                     std::vector<PsSend>& out) {
  Op& op = it->second;
  const FrameMeta& m = frame.meta;
  const std::string who = absl::StrCat("parameter server shard ", shard_);
  // DATA: must fit this shard's part of the fingerprinted operation.
  const size_t es = DTypeSize(op.fp.dtype);
  if (!op.have_fp[static_cast<size_t>(rank)] || m.phase != Phase::kPsPush ||
      m.dtype != op.fp.dtype || m.segment != shard_ ||
      m.offset < op.shard_offset ||
      m.offset + m.count > op.shard_offset + op.shard_count ||
      frame.PayloadBytes() != m.count * es) {
    FailOp(m.op_seq,
           absl::DataLossError(absl::StrCat(
               who, ": a frame from rank ", rank, " does not fit ",
               op.fp.ToString(), " (offset ", m.offset, ", count ", m.count,
               ")")),
           -1, out);
    return;
  }
  Chunk& c = op.chunks[m.offset];
  if (c.frames.empty()) {
    c.frames.resize(static_cast<size_t>(op.world));
    c.have.assign(static_cast<size_t>(op.world), false);
    c.count = m.count;
  }
  if (c.have[static_cast<size_t>(rank)] || c.count != m.count) {
    FailOp(m.op_seq, absl::DataLossError(absl::StrCat(
                         who, ": duplicate or inconsistent chunk at offset ",
                         m.offset, " from rank ", rank)),
           -1, out);
    return;
  }
  stats_.bytes_in += frame.PayloadBytes();
  c.frames[static_cast<size_t>(rank)] = std::move(frame);
  c.have[static_cast<size_t>(rank)] = true;
  ++c.arrived;
  Flush(it->first, op, out);
  if (op.sent_elems == op.shard_count && op.fps == op.world) {
    ops_.erase(it);
    ++stats_.ops_completed;
  }
}

void PsState::Flush(uint64_t op_seq, Op& op, std::vector<PsSend>& out) {
  const size_t es = DTypeSize(op.fp.dtype);
  // Results leave in offset order: a later chunk can only be complete when
  // every rank has also sent every earlier one.
  while (!op.chunks.empty() && op.chunks.begin()->second.arrived == op.world) {
    const uint64_t offset = op.chunks.begin()->first;
    Chunk& c = op.chunks.begin()->second;
    const uint64_t count = c.count;
    auto result = std::make_shared<std::vector<uint8_t>>(count * es);
    for (int r = 0; r < op.world; ++r) {
      ApplyPayload(op.fp.dtype, op.fp.op, /*reduce=*/r > 0, result->data(),
                   c.frames[static_cast<size_t>(r)]);
    }
    if (op.fp.op == ReduceOp::kAvg) {
      FinalizeAvg(op.fp.dtype, result->data(), count, op.world);
    }
    op.chunks.erase(op.chunks.begin());
    PsSend send;
    FrameMeta& meta = send.meta;
    meta.kind = FrameKind::kData;
    meta.generation = op.generation;
    meta.op_seq = op_seq;
    meta.phase = Phase::kPsPull;
    meta.segment = shard_;
    meta.offset = offset;
    meta.count = count;
    meta.dtype = op.fp.dtype;
    meta.op = op.fp.op;
    meta.sender_rank = -1;
    send.to = Recipients(op.world, /*skip=*/-1);
    stats_.bytes_out += result->size() * send.to.size();
    send.payload = std::move(result);
    out.push_back(std::move(send));
    op.sent_elems += count;
  }
}

}  // namespace halka
