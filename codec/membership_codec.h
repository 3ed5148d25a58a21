// The compact forms of a ring's membership on the rendezvous wire (issue
// 18): the Join reply's ring deflated once per generation, and a Watch
// update as a delta against the generation the watcher holds. Used by the
// rendezvous (to make them) and by halka-worker's rendezvous link (to read
// them); see Membership.delta_base and JoinReply.membership_deflate in
// proto/halka/v1.
//
// Thread-safety: free functions over values; safe from any thread.
#ifndef HALKA_CODEC_MEMBERSHIP_CODEC_H_
#define HALKA_CODEC_MEMBERSHIP_CODEC_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/cost_model.h"
#include "halka/v1/common.pb.h"

namespace halka {

// `m` serialised and zlib-deflated, without the members' (and lost
// members') last_heartbeat_age_s, and without ring_order and hosts when the
// rule gives them (Membership.host_ring_derived; InflateMembership puts
// them back).
std::string DeflateMembership(const v1::Membership& m);
// Errors: INVALID_ARGUMENT (not zlib data, or not a Membership); the
// inflated size is bounded (64 MiB).
absl::StatusOr<v1::Membership> InflateMembership(const std::string& bytes);

// The members of `next` as a delta against `base` (same job): every
// field of `next` but its members, and delta_base, delta_runs, delta_down,
// `members` holding only the entries `base` does not have (by worker_id,
// address, device, since_generation and host). Each member of `base` is
// used at most once. ring_order and hosts travel whole, or not at all when
// the rule gives them for next's members (host_ring_derived: the delta
// then costs what changed, not O(N)); ApplyMembershipDelta derives them.
v1::Membership MakeMembershipDelta(const v1::Membership& base,
                                   const v1::Membership& next);

// The whole membership from `delta` applied to `base` (copied members
// have no last_heartbeat_age_s). A message without delta_base is returned
// as it is. Errors: FAILED_PRECONDITION (base is not the generation the
// delta is against: fetch a whole membership), INVALID_ARGUMENT (runs out
// of the base's or the delta's range, or a down rank out of the ring).
absl::StatusOr<v1::Membership> ApplyMembershipDelta(const v1::Membership& base,
                                                    const v1::Membership& delta);

// A job's link model (Membership.link_model, RingHealth.link_model) on the
// wire (alpha in microseconds) and as the cost model holds it (seconds).
// Every reader converts alike, so the ranks of a generation hold the same
// bits.
LinkModel LinkModelFromProto(const v1::LinkModel& m);
void LinkModelToProto(const LinkModel& m, v1::LinkModel* out);

}  // namespace halka

#endif  // HALKA_CODEC_MEMBERSHIP_CODEC_H_
