// What gloo_bench.cc and mpi_bench.cc share: sizes ("256K", "64M") and
// bounded integers from their --key=value flags, the flags both take
// (SizeFlags), each rank's input and the exact sum it reduces to. `fail(why)`
// must not return (each program's Usage).
#ifndef HALKA_BENCH_COMPARE_BENCH_ARGS_H_
#define HALKA_BENCH_COMPARE_BENCH_ARGS_H_

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace bench_args {

template <typename Fail>
size_t ParseBytes(const std::string& text, Fail fail) {
  if (text.empty()) fail("empty size");
  char* end = nullptr;
  unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  size_t mult = 1;
  std::string suffix(end);
  if (suffix == "K" || suffix == "k") mult = size_t{1} << 10;
  else if (suffix == "M" || suffix == "m") mult = size_t{1} << 20;
  else if (suffix == "G" || suffix == "g") mult = size_t{1} << 30;
  else if (!suffix.empty()) fail(("bad size: " + text).c_str());
  return static_cast<size_t>(v) * mult;
}

template <typename Fail>
int ParseInt(const std::string& text, int lo, Fail fail) {
  char* end = nullptr;
  long v = std::strtol(text.c_str(), &end, 10);
  if (*end != '\0' || v < lo) fail(("bad number: " + text).c_str());
  return static_cast<int>(v);
}

// The flags both programs take; each program's Flags adds its own.
struct SizeFlags {
  int world = 0;
  size_t min_bytes = size_t{1} << 20;
  size_t max_bytes = size_t{64} << 20;
  int factor = 4;
  int iters = 5;
  int warmup = 1;
};

// "--key=value" as {key, value}; anything else fails.
template <typename Fail>
std::pair<std::string, std::string> SplitFlag(const std::string& arg,
                                              Fail fail) {
  auto eq = arg.find('=');
  if (arg.rfind("--", 0) != 0 || eq == std::string::npos) {
    fail(("unknown argument: " + arg).c_str());
  }
  return {arg.substr(2, eq - 2), arg.substr(eq + 1)};
}

// Reads `value` into f when `key` is one of SizeFlags' flags; false when it
// is not.
template <typename Fail>
bool ParseSizeFlag(const std::string& key, const std::string& value,
                   SizeFlags& f, Fail fail) {
  if (key == "world") f.world = ParseInt(value, 1, fail);
  else if (key == "min") f.min_bytes = ParseBytes(value, fail);
  else if (key == "max") f.max_bytes = ParseBytes(value, fail);
  else if (key == "factor") f.factor = ParseInt(value, 2, fail);
  else if (key == "iters") f.iters = ParseInt(value, 1, fail);
  else if (key == "warmup") f.warmup = ParseInt(value, 0, fail);
  else return false;
  return true;
}

// Seconds on the wall clock (since the epoch): the one clock that ranks in
// several network namespaces of one kernel share, for an iteration's span
// from the last rank's start to the last rank's end.
inline double WallSeconds() {
  return std::chrono::duration<double>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The median of `v`, which it sorts (so that its front and back are then
// the least and the most); 0 when empty.
inline double SortAndMedian(std::vector<double>& v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// Each rank's float32 input: small integers, so every sum is exact.
inline float Input(size_t i, int rank) {
  return static_cast<float>(i % 97) + static_cast<float>(rank);
}

// What every rank holds after summing Input over g ranks (exact).
inline float Expected(size_t i, int g) {
  const float rank_sum = static_cast<float>(g * (g - 1) / 2);
  return static_cast<float>(i % 97) * g + rank_sum;
}

}  // namespace bench_args

#endif  // HALKA_BENCH_COMPARE_BENCH_ARGS_H_
