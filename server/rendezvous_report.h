// Rendezvous state -> the wire: a member, a membership, and the job's
// health report (telemetry parsed, arrival lags and the ring diagnosis).
// Pure functions of a copied view: the service calls them without its lock.
#ifndef HALKA_SERVER_RENDEZVOUS_REPORT_H_
#define HALKA_SERVER_RENDEZVOUS_REPORT_H_

#include <string>

#include "absl/time/time.h"
#include "halka/v1/rendezvous.pb.h"
#include "server/rendezvous_state.h"

namespace halka {

v1::JobState ToProto(JobState s);
void FillMember(const MemberView& m, v1::Member* out);
// The view's ring order and hosts (rendezvous.proto: Membership.ring_order);
// `rank_order_too`: the order spelled out when it is rank order (health).
void FillHostRing(const MembershipView& v,
                  google::protobuf::RepeatedField<int32_t>* order,
                  google::protobuf::RepeatedPtrField<v1::HostGroup>* hosts,
                  bool rank_order_too = false);
void FillMembership(const std::string& job_id, const MembershipView& v,
                    v1::Membership* out);
// The RingHealth of job `job_id` from its view `h` at `now`: members,
// telemetry, per-rank arrival lags, edges and the diagnosis.
void FillRingHealth(const std::string& job_id, const MembershipView& h,
                    absl::Time now, v1::RingHealth* reply);

}  // namespace halka

#endif  // HALKA_SERVER_RENDEZVOUS_REPORT_H_
