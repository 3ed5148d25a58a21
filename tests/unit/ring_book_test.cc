// The worker's book of rings (worker/ring_book.h) once the worker stops:
// a call that arrives after Stop() gets no ring, neither a fresh one
// (nothing would abort it, and the stop would wait for it to reach its
// deadline) nor the old one.
#include "worker/ring_book.h"

#include <string>

#include "gtest/gtest.h"
#include "common/log.h"
#include "halka/v1/common.pb.h"

namespace halka {
namespace {

v1::Member* AddMember(v1::Membership& m, const std::string& worker,
                      const std::string& address) {
  v1::Member* x = m.add_members();
  x->set_rank(m.members_size() - 1);
  x->set_worker_id(worker);
  x->set_address(address);
  x->set_alive(true);
  x->set_since_generation(1);
  return x;
}

v1::Membership OneMember(const std::string& job, const std::string& worker,
                         const std::string& address) {
  v1::Membership m;
  m.set_job_id(job);
  m.set_generation(1);
  m.set_world_size(1);
  m.set_min_world_size(1);
  m.set_max_world_size(1);
  m.set_job_state(v1::JOB_STATE_HEALTHY);
  AddMember(m, worker, address);
  return m;
}

TEST(RingBook, BuildsTheRingUntilStoppedThenRefusesEveryCall) {
  WorkerOptions options;
  options.job_id = "book-job";
  options.worker_id = "book-w0";
  Logger log("ring_book_test");
  RingBook book(options, &log, [](uint64_t, int, const absl::Status&) {});
  book.set_address("127.0.0.1:1");
  book.Update(OneMember(options.job_id, options.worker_id, "127.0.0.1:1"));
  book.MarkJoined();

  const CallInfo call;
  absl::StatusOr<std::shared_ptr<Ring>> before = book.Acquire(call);
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_EQ(book.Ready(call), *before);
  before->reset();

  std::vector<std::shared_ptr<Ring>> rings = book.Stop();
  ASSERT_EQ(rings.size(), 1u);
  rings.clear();

  absl::StatusOr<std::shared_ptr<Ring>> after = book.Acquire(call);
  ASSERT_FALSE(after.ok());
  EXPECT_EQ(after.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(after.status().message().find("book-w0 is shutting down"),
            std::string::npos)
      << after.status();
  EXPECT_EQ(book.Ready(call), nullptr);
  EXPECT_EQ(book.InboxFor(1).status().code(), absl::StatusCode::kUnavailable);
  // A newer membership after the stop does not make a ring either.
  v1::Membership newer = OneMember(options.job_id, options.worker_id, "127.0.0.1:1");
  newer.set_generation(2);
  book.Update(newer);
  EXPECT_EQ(book.Acquire(call).status().code(), absl::StatusCode::kUnavailable);
}

// A member of the running ring that is gone: the update says whether every
// such member left by its own Leave (Member.left), which aborts nothing
// (WorkerNode::OnMembership), or one was lost.
TEST(RingBook, TellsPeersThatLeftFromPeersThatWereLost) {
  for (bool left : {true, false}) {
    WorkerOptions options;
    options.job_id = "book-job";
    options.worker_id = "w0";
    Logger log("ring_book_test");
    RingBook book(options, &log, [](uint64_t, int, const absl::Status&) {});
    book.set_address("127.0.0.1:1");
    v1::Membership m = OneMember(options.job_id, "w0", "127.0.0.1:1");
    m.set_world_size(2);
    m.set_min_world_size(2);
    m.set_max_world_size(2);
    AddMember(m, "w1", "127.0.0.1:2");
    book.Update(m);
    book.MarkJoined();
    ASSERT_TRUE(book.Acquire(CallInfo{}).ok());

    v1::Membership next = m;
    next.set_generation(2);
    next.set_job_state(v1::JOB_STATE_WAITING);
    next.mutable_members(1)->set_alive(false);
    v1::Member* gone = next.add_lost();
    *gone = m.members(1);
    gone->set_alive(false);
    if (left) gone->set_left(true);
    const MembershipUpdate u = book.Update(next);
    EXPECT_TRUE(u.newer);
    EXPECT_TRUE(u.member);
    EXPECT_TRUE(u.lost_peer);
    EXPECT_NE(u.running, nullptr);
    EXPECT_EQ(u.peers_only_left, left) << "left " << left;
    book.Stop();
  }
}

// Two members leave one after the other: the second change lists only the
// second as lost, and the first still counts as having left.
TEST(RingBook, RemembersEveryLeaverSinceTheRingWasBuilt) {
  WorkerOptions options;
  options.job_id = "book-job";
  options.worker_id = "w0";
  Logger log("ring_book_test");
  RingBook book(options, &log, [](uint64_t, int, const absl::Status&) {});
  book.set_address("127.0.0.1:1");
  v1::Membership m = OneMember(options.job_id, "w0", "127.0.0.1:1");
  m.set_world_size(3);
  m.set_min_world_size(3);
  m.set_max_world_size(3);
  AddMember(m, "w1", "127.0.0.1:2");
  AddMember(m, "w2", "127.0.0.1:3");
  book.Update(m);
  book.MarkJoined();
  ASSERT_TRUE(book.Acquire(CallInfo{}).ok());
  v1::Membership next = m;
  next.set_job_state(v1::JOB_STATE_WAITING);
  for (int gone : {1, 2}) {
    next.set_generation(next.generation() + 1);
    next.mutable_members(gone)->set_alive(false);
    next.clear_lost();
    v1::Member* x = next.add_lost();
    *x = m.members(gone);
    x->set_alive(false);
    x->set_left(true);
    const MembershipUpdate u = book.Update(next);
    EXPECT_TRUE(u.lost_peer);
    EXPECT_TRUE(u.peers_only_left) << "after w" << gone << " left";
  }
  // A third change that loses nobody new but names no leaver keeps both.
  next.set_generation(next.generation() + 1);
  next.clear_lost();
  EXPECT_TRUE(book.Update(next).peers_only_left);
  book.Stop();
}

}  // namespace
}  // namespace halka
