// What gloo_bench.cc and mpi_bench.cc share: sizes ("256K", "64M") and
// bounded integers from their --key=value flags. `fail(why)` must not
// return (each program's Usage).
#ifndef HALKA_BENCH_COMPARE_BENCH_ARGS_H_
#define HALKA_BENCH_COMPARE_BENCH_ARGS_H_

#include <cstddef>
#include <cstdlib>
#include <string>

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

}  // namespace bench_args

#endif  // HALKA_BENCH_COMPARE_BENCH_ARGS_H_
