// Runs one function per rank on its own thread and collects the results.
//
//   // Blocking: every rank of 0..g-1, results by rank.
//   auto results = RunRanks<absl::Status>(g, [&](int r) { ... });
//
//   // In the background, on a subset of ranks, while the test does
//   // something else (kills a peer, starts a server); results in the order
//   // of the ranks given.
//   auto running = StartRanks<absl::Status>({0, 1, 3}, [&](int r) { ... });
//   ...
//   std::vector<absl::Status> results = running.Join();
//
// Result must be default-constructible. Thread-safety: fn runs on one
// thread per rank at once; what it shares with the test is the test's to
// guard.
#ifndef HALKA_TESTS_TESTING_RUN_RANKS_H_
#define HALKA_TESTS_TESTING_RUN_RANKS_H_

#include <functional>
#include <memory>
#include <numeric>
#include <thread>
#include <utility>
#include <vector>

namespace halka::testing {

// 0, 1, ..., world_size - 1.
inline std::vector<int> AllRanks(int world_size) {
  std::vector<int> ranks(static_cast<size_t>(world_size));
  std::iota(ranks.begin(), ranks.end(), 0);
  return ranks;
}

// Ranks whose functions are running. Join() waits for all of them and
// returns their results (once); the destructor joins too, so that a test
// that returns early on a fatal failure never leaves a thread running.
// Movable, not copyable.
template <typename Result>
class RanksInFlight {
 public:
  RanksInFlight(const std::vector<int>& ranks, std::function<Result(int)> fn)
      : state_(std::make_shared<State>()) {
    state_->fn = std::move(fn);
    state_->slots.resize(ranks.size());
    for (size_t i = 0; i < ranks.size(); ++i) {
      // Each thread holds the state: results and fn outlive any move of
      // this handle.
      threads_.emplace_back([state = state_, i, r = ranks[i]] {
        state->slots[i].value = state->fn(r);
      });
    }
  }
  RanksInFlight(RanksInFlight&&) noexcept = default;
  RanksInFlight& operator=(RanksInFlight&&) = delete;
  RanksInFlight(const RanksInFlight&) = delete;
  RanksInFlight& operator=(const RanksInFlight&) = delete;
  ~RanksInFlight() { JoinThreads(); }

  // Blocks until every rank's function has returned.
  std::vector<Result> Join() {
    JoinThreads();
    std::vector<Result> results;
    results.reserve(state_->slots.size());
    for (Slot& s : state_->slots) results.push_back(std::move(s.value));
    return results;
  }

 private:
  // One object per rank, so that no two threads write the same memory
  // (a std::vector<bool> packs its elements into shared words).
  struct Slot {
    Result value{};
  };
  struct State {
    std::function<Result(int)> fn;
    std::vector<Slot> slots;
  };
  void JoinThreads() {
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
  }

  std::shared_ptr<State> state_;
  std::vector<std::thread> threads_;
};

// Starts fn(r) for every r in `ranks`, each on its own thread, and returns
// at once. (No overload takes a world size: StartRanks({1}, fn) must mean
// rank 1 alone; use AllRanks(g) for every rank.)
template <typename Result, typename Fn>
RanksInFlight<Result> StartRanks(const std::vector<int>& ranks, Fn fn) {
  return RanksInFlight<Result>(ranks, std::function<Result(int)>(std::move(fn)));
}

// Runs fn(r) for every rank of 0..world_size-1, each on its own thread, and
// returns when all have; results[r] is rank r's.
template <typename Result, typename Fn>
std::vector<Result> RunRanks(int world_size, Fn fn) {
  return StartRanks<Result>(AllRanks(world_size), std::move(fn)).Join();
}

}  // namespace halka::testing

#endif  // HALKA_TESTS_TESTING_RUN_RANKS_H_
