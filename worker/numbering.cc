#include "worker/numbering.h"

#include <algorithm>

namespace halka {

SelfInMembership FindSelf(const v1::Membership& m, const std::string& worker_id,
                          const std::string& address) {
  SelfInMembership self;
  auto is_self = [&](const v1::Member& x) {
    return x.worker_id() == worker_id && x.address() == address;
  };
  for (const v1::Member& x : m.members()) {
    if (x.alive() && is_self(x)) {
      self.rank = x.rank();
      self.since_generation = x.since_generation();
    }
  }
  for (const v1::Member& x : m.members()) {
    if (x.alive() && !is_self(x) &&
        x.since_generation() < self.since_generation) {
      self.others_older = true;
    }
  }
  return self;
}

NumberingDecision DecideNumbering(const NumberingInput& in) {
  const bool numbered = in.last_ring_generation != 0 &&
                        in.last_ring_numbered && in.seq != 0;
  const bool new_here =
      in.self.since_generation > in.last_ring_generation || !numbered;
  NumberingDecision d;
  d.first_op_seq = new_here && in.self.others_older
                       ? 0
                       : std::max<uint64_t>(in.seq, 1);
  d.adopted = d.first_op_seq == 0;
  d.refuse_retry = new_here && in.retry;
  return d;
}

bool IsStaleCall(bool adopted, uint64_t ring_epoch, absl::Time admitted,
                 uint64_t call_epoch, absl::Time issued) {
  return adopted && (call_epoch < ring_epoch || issued < admitted);
}

CallerOrder PlaceInCallerOrder(const CallerPlace& last, uint64_t caller_id,
                               uint64_t call_index, uint64_t next_seq,
                               uint64_t generation) {
  CallerOrder o;
  if (caller_id == 0 || call_index == 0 || caller_id != last.caller_id) {
    return o;
  }
  if (call_index <= last.call_index) {
    o.arrived_late = true;
    return o;
  }
  if (last.seq == 0 || next_seq == 0 || generation != last.generation) {
    return o;
  }
  // The caller's call `call_index` pairs with number `expected` on every
  // rank that saw each of its calls.
  const uint64_t expected = last.seq + (call_index - last.call_index);
  if (expected > next_seq) {
    if (expected - next_seq <= kMaxLostCalls) {
      o.lost = expected - next_seq;
    } else {
      o.gap_too_long = true;
    }
  }
  return o;
}

}  // namespace halka
