#include "core/timeline.h"

#include <utility>

namespace halka {

const char* TraceSpanKindName(TraceSpan::Kind kind) {
  switch (kind) {
    case TraceSpan::Kind::kPhase:
      return "phase";
    case TraceSpan::Kind::kWait:
      return "wait";
    case TraceSpan::Kind::kReduce:
      return "reduce";
    case TraceSpan::Kind::kSend:
      return "send";
    case TraceSpan::Kind::kWire:
      return "wire";
    case TraceSpan::Kind::kStall:
      return "stall";
    case TraceSpan::Kind::kWindow:
      return "window";
  }
  return "?";
}

void Timeline::Add(const TraceSpan& span) {
  if (running_.size() >= kMaxSpansPerOp) {
    ++running_dropped_;
    return;
  }
  running_.push_back(span);
}

void Timeline::BeginOp() {
  running_.clear();
  running_dropped_ = 0;
}

void Timeline::EndOp(TraceOp op) {
  op.spans = std::move(running_);
  op.spans_dropped = running_dropped_;
  running_ = {};
  ops_.push_back(std::move(op));
  while (ops_.size() > kMaxOps) {
    // The oldest operation's span storage becomes the next one's: an
    // operation's spans then cost no allocation once the timeline is full.
    running_ = std::move(ops_.front().spans);
    ops_.pop_front();
  }
  running_.clear();
  running_dropped_ = 0;
}

std::vector<TraceOp> Timeline::Ops() const {
  return std::vector<TraceOp>(ops_.begin(), ops_.end());
}

}  // namespace halka
