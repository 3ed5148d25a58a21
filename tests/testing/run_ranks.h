// Runs one function per rank on its own thread and collects the results.
#ifndef HALKA_TESTS_TESTING_RUN_RANKS_H_
#define HALKA_TESTS_TESTING_RUN_RANKS_H_

#include <thread>
#include <vector>

namespace halka::testing {

template <typename Result, typename Fn>
std::vector<Result> RunRanks(int world_size, Fn fn) {
  std::vector<Result> results(static_cast<size_t>(world_size));
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] { results[static_cast<size_t>(r)] = fn(r); });
  }
  for (auto& t : threads) t.join();
  return results;
}

}  // namespace halka::testing

#endif  // HALKA_TESTS_TESTING_RUN_RANKS_H_
