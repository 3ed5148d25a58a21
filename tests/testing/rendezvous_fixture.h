// A RendezvousState on a fake clock, for the tests of its rules
// (rendezvous_state_test, rendezvous_liveness_test): heartbeats every
// second, a member lost after 5 s of silence; workers join with an address
// of their own (Addr) and device "cpu".
#ifndef HALKA_TESTS_TESTING_RENDEZVOUS_FIXTURE_H_
#define HALKA_TESTS_TESTING_RENDEZVOUS_FIXTURE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "server/rendezvous_state.h"

namespace halka::testing {

class RendezvousFixture : public ::testing::Test {
 protected:
  static constexpr absl::Duration kTimeout = absl::Seconds(5);

  static RendezvousOptions Opts() {
    RendezvousOptions o;
    o.heartbeat_interval = absl::Seconds(1);
    o.heartbeat_timeout = kTimeout;
    return o;
  }

  static std::string Addr(const std::string& worker) {
    return absl::StrCat("host-", worker, ":7000");
  }

  static JoinArgs Args(const std::string& job, const std::string& worker,
                       int world, int rank = -1) {
    JoinArgs a;
    a.job_id = job;
    a.worker_id = worker;
    a.address = Addr(worker);
    a.device = "cpu";
    a.world_size = world;
    a.requested_rank = rank;
    return a;
  }

  absl::Status Join(const std::string& job, const std::string& worker,
                    int world, int rank = -1) {
    return state_.Join(Args(job, worker, world, rank), now_);
  }

  // Forms `job` of `world` workers w0..w{world-1} with no requested ranks.
  void Form(int world, const std::string& job = "j") {
    for (int i = 0; i < world; ++i) {
      ASSERT_TRUE(Join(job, absl::StrCat("w", i), world).ok());
    }
    ASSERT_TRUE(state_.GetAssignment(job, "w0").has_value());
  }

  absl::Time now_ = absl::FromUnixSeconds(1700000000);
  RendezvousState state_{Opts()};
};

}  // namespace halka::testing

#endif  // HALKA_TESTS_TESTING_RENDEZVOUS_FIXTURE_H_
