// The worker's book of rings (worker/ring_book.h) once the worker stops:
// a call that arrives after Stop() gets no ring, neither a fresh one
// (nothing would abort it, and the stop would wait for it to reach its
// deadline) nor the old one.
#include "worker/ring_book.h"

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
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

// A fixed job of `n` members w0..w(n-1) at 127.0.0.1:1..n, generation 1.
v1::Membership RingOf(int n) {
  v1::Membership m = OneMember("book-job", "w0", "127.0.0.1:1");
  m.set_world_size(n);
  m.set_min_world_size(n);
  m.set_max_world_size(n);
  for (int i = 1; i < n; ++i) {
    AddMember(m, absl::StrCat("w", i), absl::StrCat("127.0.0.1:", i + 1));
  }
  return m;
}

// The book of w0 in RingOf(n), joined, its ring built.
struct JoinedBook {
  explicit JoinedBook(int n) : m(RingOf(n)) {
    options.job_id = "book-job";
    options.worker_id = "w0";
    book = std::make_unique<RingBook>(
        options, &log, [](uint64_t, int, const absl::Status&) {});
    book->set_address("127.0.0.1:1");
    book->Update(m);
    book->MarkJoined();
  }
  ~JoinedBook() { book->Stop(); }
  WorkerOptions options;
  Logger log{"ring_book_test"};
  v1::Membership m;
  std::unique_ptr<RingBook> book;
};

// The next generation of `m`, waiting, with member `gone` lost (left by
// its own Leave or not).
v1::Membership Without(v1::Membership next, const v1::Membership& m, int gone,
                       bool left) {
  next.set_generation(next.generation() + 1);
  next.set_job_state(v1::JOB_STATE_WAITING);
  next.mutable_members(gone)->set_alive(false);
  next.clear_lost();
  v1::Member* x = next.add_lost();
  *x = m.members(gone);
  x->set_alive(false);
  if (left) x->set_left(true);
  return next;
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
    JoinedBook b(2);
    ASSERT_TRUE(b.book->Acquire(CallInfo{}).ok());
    const MembershipUpdate u = b.book->Update(Without(b.m, b.m, 1, left));
    EXPECT_TRUE(u.newer);
    EXPECT_TRUE(u.member);
    EXPECT_TRUE(u.lost_peer);
    EXPECT_NE(u.running, nullptr);
    EXPECT_EQ(u.peers_only_left, left) << "left " << left;
  }
}

// Two members leave one after the other: the second change lists only the
// second as lost, and the first still counts as having left.
TEST(RingBook, RemembersEveryLeaverSinceTheRingWasBuilt) {
  JoinedBook b(3);
  ASSERT_TRUE(b.book->Acquire(CallInfo{}).ok());
  v1::Membership next = b.m;
  for (int gone : {1, 2}) {
    next = Without(next, b.m, gone, /*left=*/true);
    const MembershipUpdate u = b.book->Update(next);
    EXPECT_TRUE(u.lost_peer);
    EXPECT_TRUE(u.peers_only_left) << "after w" << gone << " left";
  }
  // A third change that loses nobody new but names no leaver keeps both.
  next.set_generation(next.generation() + 1);
  next.clear_lost();
  EXPECT_TRUE(b.book->Update(next).peers_only_left);
}

}  // namespace
}  // namespace halka
