// halka-fault-driver: runs all-reduces on every worker of a job, one
// operation at a time, while a test script injects faults, and classifies
// every call: ok, error (a clear error), down (the worker is not there),
// wrong (a result that is not the reduction of one operation of the ring's
// members) or hang (a call that outlived its deadline by the margin).
//
// Before each operation the driver asks every worker (300 ms deadline) which
// generation it knows, and calls exactly the live members of the newest
// one, as the training processes of an elastic job would: a worker that is
// down, restarting or not admitted yet is skipped (a "skip" line).
//
// Every slot s contributes, for operation i, an int64 buffer whose element 0
// is 1 << s and whose element k >= 1 is (i + 1) * (k % 7 + 1). A correct sum
// therefore carries the set of contributors in element 0 (exactly
// world_size bits, the caller's among them) and world_size * (i + 1) *
// (k % 7 + 1) everywhere else: a result mixing two operations, missing a
// contribution or counting one twice is caught.
//
// With --bad_calls=P, in a share P of the operations one random member
// makes a bad call instead of its good one (issue 13), through a raw
// halka.v1.Worker stub as a foreign client would: a bad dtype or a bad kind
// (RunInline), a short inline stream (half the data, then half-close), data
// past count (one more message after the buffer is full), an abandoned
// upload (half the data, then the client cancels) or a bad shm name (Run).
// The worker refuses it, still numbers it and aborts the peers' copies; its
// own error is expected (outcome=fault kind=<kind>), the others' calls are
// checked as always. The operation after a bad one is never bad itself: it
// must succeed (when no kill hits it). A "split" is such an operation on
// which every member failed with the signature of a numbering split ("rank
// R already started operation #N while this rank waits in #M"): the ring
// did not re-synchronise within one round. Independently of bad calls, an
// operation whose members' own errors name different operation numbers
// ("rank 1 (w2, ...): all_reduce #202" next to "rank 0 (w3, ...):
// all_reduce #201") is a "mismatch": the ranks numbered that call apart.
// One such operation can happen when a kill races a call; a run of two or
// more in a row (mismatch_run) is a split that outlived a round.
//
// Output, one line per call, then one summary line:
//   call op=3 slot=2 t_ms=<start, Unix ms> ms=12 outcome=ok gen=2 world=3 rank=1 algo=ring msg=
//   call op=4 slot=1 t_ms=... ms=3 outcome=fault kind=dtype gen=0 world=0 rank=0 algo= msg=INVALID_ARGUMENT: ...
//   RESULT ops=200 calls=800 ok=700 error=80 down=20 wrong=0 hang=0 skipped=0 faults=20 split=0 recovered=19 mismatch=0 mismatch_run=0
// (recovered: operations right after a bad one that succeeded on every
// member.) Exit status: 0 when wrong, hang and split are 0 and
// mismatch_run is at most 1, else 1.
#include <atomic>
#include <algorithm>
#include <bitset>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/synchronization/mutex.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/grpc_util.h"
#include "grpcpp/grpcpp.h"
#include "halka/client.h"
#include "halka/v1/worker.grpc.pb.h"

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
ABSL_FLAG(double, bad_calls, 0,
          "share of operations in which one random member makes a bad call "
          "(bad dtype/kind, short or overlong upload, abandoned upload, bad "
          "shm name) instead of its good one");
ABSL_FLAG(uint64_t, seed, 0,
          "seed of the bad-call choices (0: from the clock; printed)");

namespace {

struct Slot {
  int slot = 0;
  std::string address;
  std::unique_ptr<halka::Client> client;
  std::unique_ptr<halka::v1::Worker::Stub> info;
};

struct Outcome {
  std::string kind;  // ok, error, down, wrong, hang, fault
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

// The bad calls a member may make instead of its good one.
constexpr const char* kFaultKinds[] = {"dtype", "kind",    "short",
                                       "extra", "abandon", "shm"};

// One bad call of `kind` through a raw stub, with the spec and data of the
// member's good call: returns what the worker answered.
grpc::Status BadCall(halka::v1::Worker::Stub& stub, const std::string& kind,
                     halka::v1::OpSpec spec, const std::vector<int64_t>& data,
                     absl::Duration deadline) {
  grpc::ClientContext ctx;
  halka::SetTimeout(ctx, deadline);
  // Delivered like halka::Client's calls: a bad call that never reached its
  // worker would be a missing call, not a refused one.
  ctx.set_wait_for_ready(true);
  const size_t total = data.size() * sizeof(int64_t);
  if (kind == "shm") {
    halka::v1::RunRequest req;
    *req.mutable_spec() = spec;
    req.set_shm_name("/etc-passwd/x");  // not a halka object
    req.set_shm_size(total);
    halka::v1::RunReply reply;
    return stub.Run(&ctx, req, &reply);
  }
  if (kind == "dtype") spec.set_dtype(static_cast<halka::v1::DType>(99));
  if (kind == "kind") spec.set_kind(static_cast<halka::v1::OpKind>(77));
  const char* p = reinterpret_cast<const char*>(data.data());
  const bool partial = kind == "short" || kind == "abandon";
  const size_t send = partial ? total / 2 : total;
  auto stream = stub.RunInline(&ctx);
  for (size_t off = 0; off < send; off += halka::kInlineChunkBytes) {
    halka::v1::InlineRequest msg;
    if (off == 0) *msg.mutable_spec() = spec;
    msg.set_data(p + off, std::min(halka::kInlineChunkBytes, send - off));
    if (!stream->Write(msg)) break;  // refused already
  }
  if (kind == "extra") {  // one more message after the buffer is full
    halka::v1::InlineRequest msg;
    msg.set_data(p, sizeof(int64_t));
    stream->Write(msg);
  }
  if (kind == "abandon") {  // the client gives up mid-upload
    absl::SleepFor(absl::Milliseconds(100));
    ctx.TryCancel();
  } else {
    stream->WritesDone();
  }
  halka::v1::InlineReply reply;
  while (stream->Read(&reply)) {
  }
  return stream->Finish();
}

// The operation number a member's own error names ("ABORTED: rank 2 (w1,
// addr): all_reduce #25 int64x...: ..."); 0 when it names none.
uint64_t OwnOpNumber(const std::string& msg) {
  const size_t r = msg.find(": rank ");
  if (r == std::string::npos || msg.find(' ') < r) return 0;
  const size_t q = msg.find("): ", r);
  if (q == std::string::npos) return 0;
  const size_t h = msg.find(" #", q + 3);
  if (h == std::string::npos || msg.find(' ', q + 3) != h) return 0;
  uint64_t n = 0;
  for (size_t k = h + 2; k < msg.size() && msg[k] >= '0' && msg[k] <= '9';
       ++k) {
    n = n * 10 + static_cast<uint64_t>(msg[k] - '0');
  }
  return n;
}

bool SplitSignature(const std::string& msg) {
  return msg.find("already started operation") != std::string::npos ||
         msg.find("waits in #") != std::string::npos;
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
    // Reconnect quickly to a worker that restarts (gRPC's default backoff
    // grows to minutes).
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
    s.info = halka::v1::Worker::NewStub(grpc::CreateCustomChannel(
        s.address, grpc::InsecureChannelCredentials(), args));
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
  const double bad_share = absl::GetFlag(FLAGS_bad_calls);
  uint64_t seed = absl::GetFlag(FLAGS_seed);
  if (seed == 0) {
    seed = static_cast<uint64_t>(absl::ToUnixNanos(absl::Now())) ^
           static_cast<uint64_t>(getpid());
  }
  std::mt19937_64 rng(seed);
  if (bad_share > 0) {
    std::cout << "bad_calls " << bad_share << " seed " << seed << std::endl;
  }
  // The spec of the good calls, as halka::Client builds it (bad calls start
  // from it).
  halka::v1::OpSpec good_spec;
  good_spec.set_kind(halka::v1::ALL_REDUCE);
  good_spec.set_dtype(halka::v1::INT64);
  good_spec.set_count(count);
  good_spec.set_op(halka::v1::SUM);
  good_spec.set_algorithm(static_cast<halka::v1::Algorithm>(opt.algorithm));
  good_spec.set_timeout_ms(
      static_cast<uint32_t>(absl::ToInt64Milliseconds(opt.timeout)));

  // Output and totals: each call prints its own line when it returns (a
  // call the driver stopped waiting for prints later, marked late=1).
  absl::Mutex out_mu;
  std::map<std::string, int> totals;
  struct Call {
    std::atomic<bool> done{false};
    absl::Time start;
  };
  std::vector<std::shared_ptr<Call>> running(slots.size());
  // Per operation (under out_mu): how its calls ended, to find splits.
  struct OpRecord {
    int members = 0;
    bool fault = false;  // one member made a bad call
    int returned = 0;
    int ok = 0;
    int split = 0;  // errors with the numbering-split signature
    std::set<uint64_t> numbers;  // the operation numbers members' errors name
  };
  std::map<int, OpRecord> records;

  // Who is in the newest ring: the live members of the newest generation
  // any worker knows, as that worker lists them. Empty while the job waits
  // below its minimum.
  auto snapshot = [&](std::vector<bool>* alive_not_in) {
    std::vector<halka::v1::InfoReply> infos(slots.size());
    std::vector<bool> answered(slots.size(), false);
    std::vector<std::thread> ask;
    for (size_t j = 0; j < slots.size(); ++j) {
      ask.emplace_back([&, j] {
        grpc::ClientContext ctx;
        halka::SetTimeout(ctx, absl::Milliseconds(300));
        answered[j] = slots[j].info->GetInfo(&ctx, halka::v1::InfoRequest(),
                                             &infos[j]).ok();
      });
    }
    for (std::thread& t : ask) t.join();
    uint64_t newest = 0;
    for (size_t j = 0; j < slots.size(); ++j) {
      if (answered[j]) newest = std::max(newest, infos[j].membership_generation());
    }
    std::set<std::string> in_newest;
    for (size_t j = 0; j < slots.size(); ++j) {
      if (!answered[j] || infos[j].membership_generation() != newest) continue;
      for (const halka::v1::Member& m : infos[j].members()) {
        if (m.alive()) in_newest.insert(m.address());
      }
      if (infos[j].job_state() == halka::v1::JOB_STATE_WAITING) {
        in_newest.clear();
      }
      break;
    }
    if (alive_not_in != nullptr) {
      alive_not_in->assign(slots.size(), false);
      for (size_t j = 0; j < slots.size(); ++j) {
        (*alive_not_in)[j] = answered[j] && !in_newest.count(slots[j].address);
      }
    }
    return in_newest;
  };

  int ops = 0;
  for (int i = 0; i < absl::GetFlag(FLAGS_ops); ++i) {
    if (absl::Now() - t0 > absl::GetFlag(FLAGS_limit)) break;
    if (!stop_file.empty() && access(stop_file.c_str(), F_OK) == 0) break;
    std::vector<bool> joining;
    std::set<std::string> in_newest = snapshot(&joining);
    // A worker that is up but not in the ring is being admitted (or joins
    // again): give it up to 2 s, as an elastic job's newcomer would be
    // waited for at a step boundary.
    for (int w = 0; w < 20 && std::count(joining.begin(), joining.end(), true);
         ++w) {
      absl::SleepFor(absl::Milliseconds(100));
      in_newest = snapshot(&joining);
    }
    std::vector<size_t> members;
    for (size_t j = 0; j < slots.size(); ++j) {
      const bool busy = running[j] != nullptr && !running[j]->done.load();
      // A listed member that did not answer (its process just restarted,
      // the channel is still reconnecting) is called all the same.
      if (in_newest.count(slots[j].address) && !busy) {
        members.push_back(j);
      } else {
        absl::MutexLock lock(&out_mu);
        ++totals["skip"];
        std::cout << "skip op=" << i << " slot=" << slots[j].slot
                  << (busy ? " busy" : in_newest.empty() ? " no-ring"
                                                         : " not-in-ring")
                  << "\n";
      }
    }
    if (members.empty()) {
      --i;  // nobody to run it on yet
      absl::SleepFor(absl::Milliseconds(100));
      continue;
    }
    ++ops;
    // A bad call by one member, never in two operations in a row (the one
    // after a bad one must succeed).
    int bad_member = -1;
    std::string bad_kind;
    {
      absl::MutexLock lock(&out_mu);
      const auto prev = records.find(i - 1);
      const bool after_fault = prev != records.end() && prev->second.fault;
      if (bad_share > 0 && !after_fault &&
          std::uniform_real_distribution<double>(0, 1)(rng) < bad_share) {
        bad_member = static_cast<int>(
            std::uniform_int_distribution<size_t>(0, members.size() - 1)(rng));
        bad_kind = kFaultKinds[std::uniform_int_distribution<size_t>(
            0, std::size(kFaultKinds) - 1)(rng)];
      }
      OpRecord& rec = records[i];
      rec.members = static_cast<int>(members.size());
      rec.fault = bad_member >= 0;
    }
    std::vector<std::shared_ptr<Call>> calls;
    for (size_t m = 0; m < members.size(); ++m) {
      const size_t j = members[m];
      const std::string fault =
          static_cast<int>(m) == bad_member ? bad_kind : "";
      auto call = std::make_shared<Call>();
      call->start = absl::Now();
      running[j] = call;
      calls.push_back(call);
      Slot* slot = &slots[j];
      std::thread([&, call, slot, i, fault] {
        std::vector<int64_t> data(count);
        data[0] = int64_t{1} << slot->slot;
        for (size_t k = 1; k < count; ++k) {
          data[k] = static_cast<int64_t>(i + 1) *
                    static_cast<int64_t>(k % 7 + 1);
        }
        Outcome o;
        absl::StatusOr<halka::OpInfo> r = halka::OpInfo();
        if (fault.empty()) {
          r = slot->client->AllReduce(absl::MakeSpan(data),
                                      halka::ReduceOp::kSum, opt);
        } else {
          halka::v1::OpSpec spec = good_spec;
          spec.set_issued_unix_ms(
              static_cast<uint64_t>(absl::ToUnixMillis(absl::Now())));
          const grpc::Status s = BadCall(*slot->info, fault, spec, data,
                                         hang_after + absl::Seconds(1));
          o.msg = absl::StrCat(
              absl::StatusCodeToString(
                  static_cast<absl::StatusCode>(s.error_code())),
              ": ", s.error_message());
        }
        o.t_ms = static_cast<double>(absl::ToUnixMillis(call->start));
        o.ms = absl::ToDoubleMilliseconds(absl::Now() - call->start);
        if (!fault.empty()) {
          // Its own error is expected; a bad call accepted is a wrong.
          o.kind = o.msg.rfind("OK: ", 0) == 0 ? "wrong" : "fault";
          if (o.kind == "wrong") o.msg = "the worker accepted the bad call";
        } else if (r.ok()) {
          o.info = *r;
          o.msg = Check(data, i, slot->slot, r->world_size);
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
        {
          absl::MutexLock lock(&out_mu);
          ++totals[o.kind];
          OpRecord& rec = records[i];
          ++rec.returned;
          rec.ok += o.kind == "ok";
          rec.split += o.kind == "error" && SplitSignature(o.msg);
          if (fault.empty() && o.kind != "ok" && OwnOpNumber(o.msg) != 0) {
            rec.numbers.insert(OwnOpNumber(o.msg));
          }
          std::cout << "call op=" << i << " slot=" << slot->slot
                    << " t_ms=" << static_cast<int64_t>(o.t_ms)
                    << " ms=" << static_cast<int64_t>(o.ms)
                    << " outcome=" << o.kind
                    << (fault.empty() ? "" : " kind=" + fault)
                    << " gen=" << o.info.generation
                    << " world=" << o.info.world_size
                    << " rank=" << o.info.rank
                    << " algo=" << o.info.algorithm
                    << " msg=" << OneLine(o.msg)
                    << std::endl;
        }
        call->done.store(true);
      }).detach();
    }
    // Wait for this operation's calls; stop waiting for a call whose
    // worker left the ring (frozen, cut off): the others go on without it,
    // as the survivors of an elastic job do.
    for (;;) {
      bool all = true;
      for (const auto& c : calls) all &= c->done.load();
      if (all) break;
      absl::SleepFor(absl::Milliseconds(50));
      std::set<std::string> now_in;
      bool left = false;
      if (absl::Now() - calls[0]->start > absl::Milliseconds(500)) {
        now_in = snapshot(nullptr);
        for (size_t k = 0; k < members.size(); ++k) {
          if (!calls[k]->done.load() &&
              !now_in.count(slots[members[k]].address)) {
            left = true;
          }
        }
      }
      bool others_done = true;
      for (size_t k = 0; k < members.size(); ++k) {
        if (!calls[k]->done.load() &&
            now_in.count(slots[members[k]].address)) {
          others_done = false;
        }
      }
      if (left && others_done) break;
    }
    absl::SleepFor(absl::GetFlag(FLAGS_pause));
  }
  // Calls still running: wait for them up to the hang bound.
  for (size_t j = 0; j < slots.size(); ++j) {
    if (running[j] == nullptr) continue;
    while (!running[j]->done.load() &&
           absl::Now() - running[j]->start < hang_after) {
      absl::SleepFor(absl::Milliseconds(50));
    }
    if (!running[j]->done.load()) {
      absl::MutexLock lock(&out_mu);
      ++totals["hang"];
      std::cout << "call op=-1 slot=" << slots[j].slot << " t_ms="
                << absl::ToUnixMillis(running[j]->start) << " ms="
                << absl::ToInt64Milliseconds(absl::Now() - running[j]->start)
                << " outcome=hang gen=0 world=0 rank=0 msg=never returned"
                << std::endl;
    }
  }
  absl::MutexLock lock(&out_mu);
  int calls = 0;
  for (const auto& [k, n] : totals) calls += k == "skip" ? 0 : n;
  // Splits: the operation after a bad one failed on every member with the
  // numbering-split signature.
  int faults = 0, split = 0, recovered = 0;
  for (const auto& [op, rec] : records) {
    if (!rec.fault) continue;
    ++faults;
    const auto next = records.find(op + 1);
    if (next == records.end()) continue;
    const OpRecord& n = next->second;
    if (n.returned == n.members && n.split == n.members) {
      ++split;
      std::cout << "split op=" << op + 1 << " after the bad call of op="
                << op << ": all " << n.members
                << " members failed with a numbering split" << std::endl;
    }
    recovered += n.returned == n.members && n.ok == n.members;
  }
  // Mismatches, and the longest run of them in consecutive operations.
  int mismatch = 0, mismatch_run = 0, run = 0, last = -2;
  for (const auto& [op, rec] : records) {
    if (rec.numbers.size() < 2) continue;
    ++mismatch;
    run = op == last + 1 ? run + 1 : 1;
    last = op;
    mismatch_run = std::max(mismatch_run, run);
    std::string nums;
    for (uint64_t n : rec.numbers) absl::StrAppend(&nums, nums.empty() ? "#" : ", #", n);
    std::cout << "mismatch op=" << op << ": members' errors name " << nums
              << std::endl;
  }
  std::cout << "RESULT ops=" << ops << " calls=" << calls
            << " ok=" << totals["ok"] << " error=" << totals["error"]
            << " down=" << totals["down"] << " wrong=" << totals["wrong"]
            << " hang=" << totals["hang"] << " skipped=" << totals["skip"]
            << " faults=" << faults << " split=" << split
            << " recovered=" << recovered << " mismatch=" << mismatch
            << " mismatch_run=" << mismatch_run << std::endl;
  const bool good = totals["wrong"] == 0 && totals["hang"] == 0 &&
                    split == 0 && mismatch_run <= 1;
  std::cout.flush();
  // Detached calls may still hold the clients: leave without destructors.
  std::_Exit(good ? 0 : 1);
}
