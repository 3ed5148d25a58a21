// How a worker numbers its caller's calls on a new ring: the rules that keep
// every rank numbering the i-th call alike across membership changes, as
// pure functions (no gRPC, no clock, no locks), unit-tested on their own
// (tests/unit/numbering_test.cc). RingBook applies them.
#ifndef HALKA_WORKER_NUMBERING_H_
#define HALKA_WORKER_NUMBERING_H_

#include <cstdint>
#include <string>

#include "absl/time/time.h"
#include "halka/v1/rendezvous.pb.h"

namespace halka {

// This worker's place in a membership: its rank (-1: not an alive member),
// the generation it was admitted in, and whether an alive member was
// admitted before it (only such a member can carry the ring's numbering).
struct SelfInMembership {
  int rank = -1;
  uint64_t since_generation = 0;
  bool others_older = false;
};
// A member is this worker when both its id and its address match (a
// restarted process with the same id has a new address or incarnation).
SelfInMembership FindSelf(const v1::Membership& m, const std::string& worker_id,
                          const std::string& address);

// What the worker knows when it builds the ring of a new generation.
struct NumberingInput {
  // The generation of the ring it ran on so far; 0 when it has none.
  uint64_t last_ring_generation = 0;
  // That ring holds a call number (its communicator is not waiting to
  // adopt one), as read by the caller.
  bool last_ring_numbered = false;
  // The number the call will run as where this worker keeps its numbering.
  uint64_t seq = 1;
  // The call runs again after the membership changed under it.
  bool retry = false;
  SelfInMembership self;
};

struct NumberingDecision {
  // The first operation's number on the new ring; 0: adopt the number of
  // the first operation the peers start.
  uint64_t first_op_seq = 1;
  // The worker is new in this ring: its calls made before it was admitted
  // belong to no operation of this ring (see IsStaleCall).
  bool adopted = false;
  // A re-run of a call that straddled this worker's re-admission: the
  // others may have run it without this worker; it must fail (ABORTED).
  bool refuse_retry = false;
};

// The rule: a worker keeps its numbering only if it holds a number from a
// ring of the membership it joined (or rejoined) in. A worker admitted in
// a later generation than its last ring, or whose last ring never got a
// number (a second admission came before any operation), is new: it
// adopts the ring's number when an older member exists, and otherwise
// (every member is as new as it is) starts the numbering from its own.
NumberingDecision DecideNumbering(const NumberingInput& in);

// A call is stale on a ring this worker adopted when it arrived before the
// worker last learned it was out of the ring (`call_epoch` < the ring's
// epoch) or its caller issued it before the worker was re-admitted
// (`issued` < `admitted`). Such a call fails with ABORTED: the ring moved
// on without it, and running it could pair it with a newer call elsewhere.
bool IsStaleCall(bool adopted, uint64_t ring_epoch, absl::Time admitted,
                 uint64_t call_epoch, absl::Time issued);

// The caller's own order of its calls (OpSpec.caller_id, call_index): the
// last call of a caller that took a number here, on which ring, as which
// number.
struct CallerPlace {
  uint64_t caller_id = 0;   // 0: none yet
  uint64_t call_index = 0;
  uint64_t seq = 0;         // 0: the call took no number known here
  uint64_t generation = 0;  // the ring it was numbered on
};

// What a call's place in its caller's order asks of the worker, decided
// in the call's turn, before it is numbered.
struct CallerOrder {
  // The call arrived after a later call of the same caller (or is a copy
  // of one): it is refused, and takes no number (its number was given up
  // when the later call came first).
  bool arrived_late = false;
  // Calls of this caller that never reached this worker (the indices
  // between the last call and this one) whose numbers the ring has not
  // passed yet: the worker gives each up, in order, before this call.
  uint64_t lost = 0;
  // The gap is longer than kMaxLostCalls: nothing is given up.
  bool gap_too_long = false;
};
// At most this many lost calls are given up at once; a longer gap is not a
// lost call on a broken connection, and the worker numbers the call as it
// arrives (and logs it).
constexpr uint64_t kMaxLostCalls = 64;

// `last`: the caller's place as the worker recorded it; `caller_id`,
// `call_index`: the arriving call's (0: not given); `next_seq`: the number
// the call will take on `generation`'s ring, which holds a number. Only a
// gap on the same ring, behind which the worker's numbering trails the
// caller's, is filled: calls without an index (a foreign client) and
// numbers the ring skipped ahead (a peer was further) keep the worker's
// own count.
CallerOrder PlaceInCallerOrder(const CallerPlace& last, uint64_t caller_id,
                               uint64_t call_index, uint64_t next_seq,
                               uint64_t generation);

}  // namespace halka

#endif  // HALKA_WORKER_NUMBERING_H_
