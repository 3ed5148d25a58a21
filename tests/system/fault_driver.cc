// halka-fault-driver: runs all-reduces on every worker of a job, one
// operation at a time, while a test script injects faults, and classifies
// every call: ok, error (a clear error), down (the worker is not there),
// wrong (a result that is not the reduction of one operation of the ring's
// members) or hang (a call that outlived its deadline by the margin).
//
// Every slot s contributes, for operation i, an int64 buffer whose element 0
// is 1 << s and whose element k >= 1 is (i + 1) * (k % 7 + 1). A correct sum
// therefore carries the set of contributors in element 0 (exactly
// world_size bits, the caller's among them) and world_size * (i + 1) *
// (k % 7 + 1) everywhere else: a result mixing two operations, missing a
// contribution or counting one twice is caught.
//
// Output, one line per call, then one summary line:
//   call op=3 slot=2 t_ms=1234 ms=12 outcome=ok gen=2 world=3 rank=1 msg=
//   RESULT ops=200 calls=800 ok=700 error=80 down=20 wrong=0 hang=0
// Exit status: 0 when wrong == 0 and hang == 0, else 1.
#include <atomic>
#include <bitset>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "halka/client.h"

ABSL_FLAG(std::string, workers, "",
          "slot=host:port,... (slot in [0, 62]): the workers' API addresses");
ABSL_FLAG(int, ops, 20, "operations to run");
ABSL_FLAG(int64_t, count, 1 << 18, "int64 elements per all-reduce");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(10),
          "deadline of each operation");
ABSL_FLAG(absl::Duration, margin, absl::Seconds(10),
          "a call slower than timeout + margin counts as a hang");
ABSL_FLAG(absl::Duration, pause, absl::Milliseconds(20),
          "pause between operations");
ABSL_FLAG(absl::Duration, limit, absl::Minutes(10),
          "stop starting operations after this long");
ABSL_FLAG(std::string, algorithm, "auto", "auto, ring or naive");
ABSL_FLAG(std::string, stop_file, "",
          "stop starting operations once this file exists");

namespace {

struct Slot {
  int slot = 0;
  std::string address;
  std::unique_ptr<halka::Client> client;
};

struct Outcome {
  std::string kind;  // ok, error, down, wrong, hang
  std::string msg;
  halka::OpInfo info;
  double ms = 0;
  double t_ms = 0;
};

std::string OneLine(std::string s) {
  for (char& c : s) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return s.size() > 600 ? s.substr(0, 600) + "..." : s;
}

// Empty when `data` is the sum of operation `i` over exactly `world`
// contributors including `slot`; else what is wrong.
std::string Check(const std::vector<int64_t>& data, int i, int slot,
                  int world) {
  const uint64_t mask = static_cast<uint64_t>(data[0]);
  const int bits = static_cast<int>(std::bitset<64>(mask).count());
  if (bits != world || !(mask >> slot & 1)) {
    return absl::StrCat("contributors mask 0x", absl::Hex(mask), " has ",
                        bits, " bits, world_size is ", world,
                        ", own slot ", slot);
  }
  for (size_t k = 1; k < data.size(); ++k) {
    const int64_t want = static_cast<int64_t>(world) * (i + 1) *
                         static_cast<int64_t>(k % 7 + 1);
    if (data[k] != want) {
      return absl::StrCat("element ", k, " is ", data[k], ", want ", want);
    }
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::vector<Slot> slots;
  for (absl::string_view part :
       absl::StrSplit(absl::GetFlag(FLAGS_workers), ',', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(part, '=');
    Slot s;
    if (!absl::SimpleAtoi(kv.first, &s.slot) || s.slot < 0 || s.slot > 62 ||
        kv.second.empty()) {
      std::cerr << "bad --workers entry: " << part << "\n";
      return 2;
    }
    s.address = kv.second;
    halka::Client::Options o;
    o.transfer = halka::Client::Transfer::kInline;
    auto c = halka::Client::Connect(s.address, o);
    if (!c.ok()) {
      std::cerr << c.status() << "\n";
      return 2;
    }
    s.client = std::move(*c);
    slots.push_back(std::move(s));
  }
  if (slots.empty()) {
    std::cerr << "--workers is required\n";
    return 2;
  }
  const size_t count = static_cast<size_t>(
      std::max<int64_t>(2, absl::GetFlag(FLAGS_count)));
  halka::OpOptions opt;
  opt.timeout = absl::GetFlag(FLAGS_timeout);
  const std::string algo = absl::GetFlag(FLAGS_algorithm);
  opt.algorithm = algo == "ring"    ? halka::Algorithm::kRing
                  : algo == "naive" ? halka::Algorithm::kNaive
                                    : halka::Algorithm::kAuto;
  const absl::Duration hang_after = opt.timeout + absl::GetFlag(FLAGS_margin);
  const absl::Time t0 = absl::Now();
  const std::string stop_file = absl::GetFlag(FLAGS_stop_file);
  std::map<std::string, int> totals;
  int ops = 0;
  for (int i = 0; i < absl::GetFlag(FLAGS_ops); ++i) {
    if (absl::Now() - t0 > absl::GetFlag(FLAGS_limit)) break;
    if (!stop_file.empty() && access(stop_file.c_str(), F_OK) == 0) break;
    ++ops;
    std::vector<Outcome> out(slots.size());
    std::vector<std::thread> threads;
    std::atomic<int> done{0};
    for (size_t j = 0; j < slots.size(); ++j) {
      threads.emplace_back([&, j] {
        Slot& s = slots[j];
        std::vector<int64_t> data(count);
        data[0] = int64_t{1} << s.slot;
        for (size_t k = 1; k < count; ++k) {
          data[k] = static_cast<int64_t>(i + 1) *
                    static_cast<int64_t>(k % 7 + 1);
        }
        const absl::Time start = absl::Now();
        absl::StatusOr<halka::OpInfo> r = s.client->AllReduce(
            absl::MakeSpan(data), halka::ReduceOp::kSum, opt);
        Outcome& o = out[j];
        o.t_ms = absl::ToDoubleMilliseconds(start - t0);
        o.ms = absl::ToDoubleMilliseconds(absl::Now() - start);
        if (r.ok()) {
          o.info = *r;
          o.msg = Check(data, i, s.slot, r->world_size);
          o.kind = o.msg.empty() ? "ok" : "wrong";
        } else {
          o.msg = std::string(r.status().message());
          const bool unreachable =
              r.status().code() == absl::StatusCode::kUnavailable &&
              (o.msg.find("failed to connect") != std::string::npos ||
               o.msg.find("Connection refused") != std::string::npos ||
               o.msg.find("connections to all backends failed") !=
                   std::string::npos ||
               o.msg.find("not joined") != std::string::npos);
          o.kind = unreachable ? "down" : "error";
          o.msg = absl::StrCat(absl::StatusCodeToString(r.status().code()),
                               ": ", o.msg);
        }
        if (absl::Milliseconds(o.ms) > hang_after) o.kind = "hang";
        done.fetch_add(1);
      });
    }
    // A call that never returns would block the join below forever: give
    // up loudly instead.
    const absl::Time watchdog = absl::Now() + hang_after + absl::Seconds(30);
    while (done.load() < static_cast<int>(slots.size())) {
      if (absl::Now() > watchdog) {
        std::cout << "RESULT ops=" << ops << " HANG: a call did not return "
                  << "within " << absl::FormatDuration(hang_after +
                                                       absl::Seconds(30))
                  << std::endl;
        std::_Exit(1);
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
    for (std::thread& t : threads) t.join();
    for (size_t j = 0; j < slots.size(); ++j) {
      const Outcome& o = out[j];
      ++totals[o.kind];
      std::cout << "call op=" << i << " slot=" << slots[j].slot
                << " t_ms=" << static_cast<int64_t>(o.t_ms)
                << " ms=" << static_cast<int64_t>(o.ms)
                << " outcome=" << o.kind << " gen=" << o.info.generation
                << " world=" << o.info.world_size
                << " rank=" << o.info.rank << " msg=" << OneLine(o.msg)
                << "\n";
    }
    std::cout.flush();
    absl::SleepFor(absl::GetFlag(FLAGS_pause));
  }
  int calls = 0;
  for (const auto& [k, n] : totals) calls += n;
  std::cout << "RESULT ops=" << ops << " calls=" << calls
            << " ok=" << totals["ok"] << " error=" << totals["error"]
            << " down=" << totals["down"] << " wrong=" << totals["wrong"]
            << " hang=" << totals["hang"] << std::endl;
  return totals["wrong"] == 0 && totals["hang"] == 0 ? 0 : 1;
}
