#include "bench/scale/member_sim.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "halka/v1/rendezvous.grpc.pb.h"

namespace halka::scale {
namespace {


// The top-level varint fields of a serialised message, by number (0 when
// absent). The simulator reads only ranks and generations: one process
// parsing every member's full reply would measure protobuf, not the
// rendezvous (a real member parses its own reply).
std::map<int, uint64_t> Varints(const grpc::ByteBuffer& bytes) {
  std::map<int, uint64_t> out;
  std::vector<grpc::Slice> slices;
  if (!bytes.Dump(&slices).ok()) return out;
  std::string flat;
  for (const grpc::Slice& sl : slices) {
    flat.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
  }
  google::protobuf::io::CodedInputStream in(
      reinterpret_cast<const uint8_t*>(flat.data()), static_cast<int>(flat.size()));
  for (uint32_t tag; (tag = in.ReadTag()) != 0;) {
    using google::protobuf::internal::WireFormatLite;
    if (WireFormatLite::GetTagWireType(tag) == WireFormatLite::WIRETYPE_VARINT) {
      uint64_t v = 0;
      if (!in.ReadVarint64(&v)) break;
      out[WireFormatLite::GetTagFieldNumber(tag)] = v;
    } else if (!WireFormatLite::SkipField(&in, tag)) {
      break;
    }
  }
  return out;
}

grpc::ByteBuffer Bytes(const google::protobuf::MessageLite& m) {
  grpc::Slice s(m.SerializeAsString());
  return grpc::ByteBuffer(&s, 1);
}

// One Watch stream (server-streaming, driven as a generic stream): records
// when each generation arrived.
class WatchReader final
    : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  // Like halka-worker, the watcher names the generation its Join returned:
  // the stream's first message is the next change.
  void Start(grpc::GenericStub* stub, const std::string& job_id,
             const std::string& worker_id, uint64_t known_generation,
             bool deltas) {
    v1::WatchRequest req;
    req.set_job_id(job_id);
    req.set_worker_id(worker_id);
    req.set_known_generation(known_generation);
    req.set_deltas(deltas);
    req_ = Bytes(req);
    stub->PrepareBidiStreamingCall(&ctx_, "/halka.v1.Rendezvous/Watch",
                                   grpc::StubOptions(), this);
    StartWriteLast(&req_, grpc::WriteOptions());
    StartRead(&msg_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows
    const uint64_t generation = Varints(msg_)[2];  // Membership.generation
    {
      absl::MutexLock lock(&mu_);
      seen_.emplace_back(generation, absl::Now());
      bytes_.emplace_back(generation, static_cast<int64_t>(msg_.Length()));
    }
    StartRead(&msg_);
  }
  void OnDone(const grpc::Status&) override {
    absl::MutexLock lock(&mu_);
    done_ = true;
  }
  void Cancel() { ctx_.TryCancel(); }
  bool WaitDone(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&done_), timeout);
  }
  // The stream has not ended.
  bool open() {
    absl::MutexLock lock(&mu_);
    return !done_;
  }
  // Bytes of the messages of generations newer than `after`.
  int64_t BytesAfter(uint64_t after) {
    absl::MutexLock lock(&mu_);
    int64_t n = 0;
    for (const auto& [g, b] : bytes_) n += g > after ? b : 0;
    return n;
  }
  // When the first generation newer than `after` arrived.
  std::optional<absl::Time> SawAfter(uint64_t after) {
    absl::MutexLock lock(&mu_);
    for (const auto& [g, t] : seen_) {
      if (g > after) return t;
    }
    return std::nullopt;
  }

 private:
  grpc::ClientContext ctx_;
  grpc::ByteBuffer req_;
  grpc::ByteBuffer msg_;
  absl::Mutex mu_;
  std::vector<std::pair<uint64_t, absl::Time>> seen_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<uint64_t, int64_t>> bytes_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

struct Member {
  int index = 0;
  std::string id;
  v1::Rendezvous::Stub* stub = nullptr;
  v1::Rendezvous::Stub* beat_stub = nullptr;  // heartbeats
  grpc::GenericStub* generic = nullptr;
  // Join
  grpc::ClientContext join_ctx;
  grpc::ByteBuffer join_req;
  grpc::ByteBuffer join_reply;
  // Heartbeats (the driver thread starts them; at most one in flight).
  std::atomic<bool> beating{false};
  std::atomic<bool> in_flight{false};
  std::atomic<bool> stopped{false};
  std::atomic<uint64_t> generation{0};
  absl::Time next_beat = absl::InfiniteFuture();  // driver thread only
  std::unique_ptr<grpc::ClientContext> beat_ctx;
  v1::HeartbeatRequest beat_req;
  v1::HeartbeatReply beat_reply;
  absl::Time beat_sent;
  bool told_lost = false;  // guarded by Sim::mu
  std::unique_ptr<WatchReader> watch;
};

double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1,
                            static_cast<size_t>(p * static_cast<double>(v.size())));
  return v[i];
}

class Sim {
 public:
  explicit Sim(const SimOptions& o) : o_(o) {}

  SimResult Run() {
    Connect();
    const double cpu0 = CpuSeconds();
    std::thread driver([this] { Drive(); });
    const absl::Time first = absl::Now();
    start_ = first;
    const int n = o_.members;
    absl::Time last_sent = first;
    for (int i = 0; i < n; ++i) {
      absl::Time at = first;
      if (n > 1) at += o_.join_spread * i / (n - 1);
      if (i == n - 1) at += o_.last_join_delay;
      absl::SleepFor(at - absl::Now());
      last_sent = absl::Now();
      SendJoin(*members_[static_cast<size_t>(i)]);
    }
    SimResult r;
    AwaitJoins(first, last_sent, r);
    absl::SleepFor(o_.steady);
    Member& leaver = *members_.back();
    uint64_t before;
    {
      absl::MutexLock lock(&mu_);
      before = steady_generation_;
      r.steady_generation = steady_generation_;
      r.false_deaths = false_deaths_;
    }
    int open = 0;
    for (auto& m : members_) open += m->watch && m->watch->open() ? 1 : 0;
    r.watchers_open = open;
    if (o_.change_at_end && leaver.beating) {
      MeasureChange(leaver, before, open, r);
    }
    stop_ = true;
    driver.join();
    for (auto& m : members_) {
      if (m->watch) m->watch->Cancel();
    }
    for (auto& m : members_) {
      if (m->watch) m->watch->WaitDone(absl::Seconds(5));
    }
    {
      absl::MutexLock lock(&mu_);
      // Beats in flight finish within their 2 s deadline.
      auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return beats_in_flight_ == 0;
      };
      mu_.AwaitWithTimeout(absl::Condition(&idle), absl::Seconds(5));
      r.heartbeats = static_cast<int>(latencies_ms_.size()) + beat_errors_;
      r.heartbeat_errors = beat_errors_;
      r.first_heartbeat_error = first_beat_error_;
      r.heartbeat_p50_ms = Percentile(latencies_ms_, 0.50);
      r.heartbeat_p99_ms = Percentile(latencies_ms_, 0.99);
      for (const auto& v : per_second_) {
        r.p99_by_second_ms.push_back(Percentile(v, 0.99));
      }
      r.steady_p50_ms = Percentile(steady_ms_, 0.50);
      r.steady_p99_ms = Percentile(steady_ms_, 0.99);
      r.peak_threads = peak_threads_;
      // Joins still blocked would outlive the members: cancel them.
      for (auto& m : members_) m->join_ctx.TryCancel();
      auto all = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return answered_ == o_.members;
      };
      mu_.AwaitWithTimeout(absl::Condition(&all), absl::Seconds(5));
    }
    if (o_.rendezvous_pid > 0) {
      if (auto s = SampleProcess(o_.rendezvous_pid); s.ok()) r.at_end = *s;
    }
    r.sim_cpu_seconds = CpuSeconds() - cpu0;
    return r;
  }

 private:
  // The channels (members_per_channel members on each) and the members.
  void Connect() {
    const int n = o_.members;
    const int per = std::max(1, o_.members_per_channel);
    for (int c = 0; c * per < n; ++c) {
      grpc::ChannelArguments args;
      args.SetInt("halka.scale.channel", c);  // one connection each
      args.SetMaxReceiveMessageSize(64 << 20);
      auto channel = grpc::CreateCustomChannel(
          o_.rendezvous, grpc::InsecureChannelCredentials(), args);
      stubs_.push_back(v1::Rendezvous::NewStub(channel));
      generics_.push_back(std::make_unique<grpc::GenericStub>(channel));
      if (o_.heartbeat_channels) {
        grpc::ChannelArguments beat_args;
        beat_args.SetInt("halka.scale.beat_channel", c);  // a connection each
        beat_stubs_.push_back(v1::Rendezvous::NewStub(grpc::CreateCustomChannel(
            o_.rendezvous, grpc::InsecureChannelCredentials(), beat_args)));
      }
    }
    members_.reserve(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      auto m = std::make_unique<Member>();
      m->index = i;
      m->id = absl::StrCat("sim-", i);
      m->stub = stubs_[static_cast<size_t>(i / per)].get();
      m->generic = generics_[static_cast<size_t>(i / per)].get();
      m->beat_stub = o_.heartbeat_channels
                         ? beat_stubs_[static_cast<size_t>(i / per)].get()
                         : m->stub;
      members_.push_back(std::move(m));
    }
  }

  // The joins' answers (waited for up to join_timeout) and their cost, in r.
  void AwaitJoins(absl::Time first, absl::Time last_sent, SimResult& r) {
    {
      absl::MutexLock lock(&mu_);
      auto all = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return answered_ == o_.members;
      };
      mu_.AwaitWithTimeout(absl::Condition(&all), o_.join_timeout);
      r.joined = joined_;
      r.join_errors = answered_ - joined_;
      r.first_join_error = first_join_error_;
      r.join_time = last_answer_ - first;
      r.after_last_join = last_answer_ - last_sent;
      r.min_join_generation = min_gen_;
      r.max_join_generation = max_gen_;
      r.join_reply_bytes = join_reply_bytes_;
    }
    if (o_.rendezvous_pid > 0) {
      if (auto s = SampleProcess(o_.rendezvous_pid); s.ok()) {
        r.joins_cpu_seconds = s->cpu_seconds;
      }
    }
    if (!o_.rendezvous_log.empty()) {
      std::ifstream log(o_.rendezvous_log, std::ios::ate | std::ios::binary);
      r.joins_log_bytes = static_cast<long>(log.tellg());
    }
  }

  // The leaver leaves: when every other open watcher saw it, in r.
  void MeasureChange(Member& leaver, uint64_t before, int open, SimResult& r) {
    leaver.stopped = true;
    const absl::Time t0 = absl::Now();
    {
      absl::MutexLock lock(&mu_);
      change_at_ = t0;
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(t0 + absl::Seconds(10)));
    v1::LeaveRequest req;
    req.set_job_id(o_.job_id);
    req.set_worker_id(leaver.id);
    v1::LeaveReply reply;
    if (leaver.stub->Leave(&ctx, req, &reply).ok()) {
      // Every watcher that was open, except the leaver's own.
      const absl::Time limit = absl::Now() + absl::Seconds(10);
      absl::Time latest = t0;
      int saw = 0;
      for (auto& m : members_) {
        if (!m->watch || !m->watch->open() || m.get() == &leaver) continue;
        std::optional<absl::Time> t;
        while (!(t = m->watch->SawAfter(before)) && absl::Now() < limit) {
          absl::SleepFor(absl::Milliseconds(5));
        }
        if (t) {
          ++saw;
          latest = std::max(latest, *t);
        }
      }
      r.watchers_saw_change = saw;
      for (auto& m : members_) {
        if (m->watch) r.change_watch_bytes += m->watch->BytesAfter(before);
      }
      const int expected =
          open - (leaver.watch && leaver.watch->open() ? 1 : 0);
      if (saw == expected) r.change_reached_all = latest - t0;
    }
  }

  void SendJoin(Member& m) {
    v1::JoinRequest req;
    req.set_job_id(o_.job_id);
    req.set_worker_id(m.id);
    req.set_address(absl::StrCat("127.0.0.1:", 20000 + m.index));
    req.set_world_size(o_.members);
    req.set_incarnation(static_cast<uint64_t>(m.index) + 1);
    req.set_compact_membership(o_.compact);
    m.join_req = Bytes(req);
    m.join_ctx.set_deadline(absl::ToChronoTime(absl::Now() + o_.join_timeout));
    m.generic->UnaryCall(&m.join_ctx, "/halka.v1.Rendezvous/Join",
                         grpc::StubOptions(), &m.join_req, &m.join_reply,
                         [this, &m](grpc::Status s) { OnJoined(m, s); });
  }

  void OnJoined(Member& m, const grpc::Status& s) {
    const absl::Time now = absl::Now();
    const uint64_t generation = s.ok() ? Varints(m.join_reply)[3] : 0;
    {
      absl::MutexLock lock(&mu_);
      ++answered_;
      last_answer_ = std::max(last_answer_, now);
      if (!s.ok()) {
        if (first_join_error_.empty()) {
          first_join_error_ = absl::StrCat(m.id, ": ", s.error_message());
        }
        return;
      }
      ++joined_;
      join_reply_bytes_ += static_cast<int64_t>(m.join_reply.Length());
      const uint64_t g = generation;
      min_gen_ = min_gen_ == 0 ? g : std::min(min_gen_, g);
      max_gen_ = std::max(max_gen_, g);
    }
    m.generation = generation;
    m.beating = true;  // the driver beats at once
    if (m.index < o_.watchers) {
      m.watch = std::make_unique<WatchReader>();
      m.watch->Start(m.generic, o_.job_id, m.id, generation, o_.compact);
    }
  }

  void Drive() {
    absl::Time next_sample = absl::Now();
    while (!stop_) {
      const absl::Time now = absl::Now();
      for (auto& mp : members_) {
        Member& m = *mp;
        if (!m.beating || m.stopped || m.in_flight) continue;
        if (m.next_beat == absl::InfiniteFuture()) m.next_beat = now;
        if (m.next_beat > now) continue;
        m.next_beat = now + o_.heartbeat_interval;
        Beat(m);
      }
      if (o_.rendezvous_pid > 0 && now >= next_sample) {
        next_sample = now + absl::Milliseconds(100);
        if (auto s = SampleProcess(o_.rendezvous_pid); s.ok()) {
          absl::MutexLock lock(&mu_);
          peak_threads_ = std::max(peak_threads_, s->threads);
        }
      }
      absl::SleepFor(absl::Milliseconds(2));
    }
  }

  void Beat(Member& m) {
    m.in_flight = true;
    {
      absl::MutexLock lock(&mu_);
      ++beats_in_flight_;
    }
    m.beat_ctx = std::make_unique<grpc::ClientContext>();
    m.beat_ctx->set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
    m.beat_req.set_job_id(o_.job_id);
    m.beat_req.set_worker_id(m.id);
    m.beat_req.set_generation(m.generation);
    m.beat_req.set_incarnation(static_cast<uint64_t>(m.index) + 1);
    m.beat_reply.Clear();
    m.beat_sent = absl::Now();
    m.beat_stub->async()->Heartbeat(
        m.beat_ctx.get(), &m.beat_req, &m.beat_reply, [this, &m](grpc::Status s) {
          const double ms =
              absl::ToDoubleMilliseconds(absl::Now() - m.beat_sent);
          {
            absl::MutexLock lock(&mu_);
            --beats_in_flight_;
            if (s.ok()) {
              latencies_ms_.push_back(ms);
              const size_t second = static_cast<size_t>(
                  absl::ToInt64Seconds(m.beat_sent - start_));
              if (per_second_.size() <= second) per_second_.resize(second + 1);
              per_second_[second].push_back(ms);
              if (m.beat_sent > last_answer_ + 2 * o_.heartbeat_interval &&
                  answered_ == o_.members && m.beat_sent < change_at_) {
                steady_ms_.push_back(ms);
              }
              if (!m.stopped) {
                steady_generation_ =
                    std::max(steady_generation_, m.beat_reply.generation());
              }
            } else if (!m.stopped) {  // the leaver's last beat may race
              ++beat_errors_;
              if (first_beat_error_.empty()) {
                first_beat_error_ = absl::StrCat(m.id, ": ", s.error_message());
              }
              if (s.error_code() == grpc::StatusCode::FAILED_PRECONDITION &&
                  !m.told_lost) {
                m.told_lost = true;
                ++false_deaths_;
              }
            }
          }
          if (s.ok()) m.generation = m.beat_reply.generation();
          m.in_flight = false;
        });
  }

  const SimOptions o_;
  std::vector<std::unique_ptr<v1::Rendezvous::Stub>> stubs_;
  std::vector<std::unique_ptr<grpc::GenericStub>> generics_;
  std::vector<std::unique_ptr<v1::Rendezvous::Stub>> beat_stubs_;
  std::vector<std::unique_ptr<Member>> members_;
  std::atomic<bool> stop_{false};
  absl::Mutex mu_;
  int answered_ ABSL_GUARDED_BY(mu_) = 0;
  int joined_ ABSL_GUARDED_BY(mu_) = 0;
  std::string first_join_error_ ABSL_GUARDED_BY(mu_);
  absl::Time last_answer_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  uint64_t min_gen_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t max_gen_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t join_reply_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<double> latencies_ms_ ABSL_GUARDED_BY(mu_);
  std::vector<double> steady_ms_ ABSL_GUARDED_BY(mu_);
  absl::Time start_ = absl::Now();
  absl::Time change_at_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  std::vector<std::vector<double>> per_second_ ABSL_GUARDED_BY(mu_);
  int beat_errors_ ABSL_GUARDED_BY(mu_) = 0;
  int beats_in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  std::string first_beat_error_ ABSL_GUARDED_BY(mu_);
  int false_deaths_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t steady_generation_ ABSL_GUARDED_BY(mu_) = 0;
  int peak_threads_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

absl::StatusOr<ProcessSample> SampleProcess(pid_t pid) {
  ProcessSample s;
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string line;
  if (!std::getline(stat, line)) {
    return absl::NotFoundError(absl::StrCat("no process ", pid));
  }
  // Fields after the command name (which may hold spaces): state is 3rd,
  // utime 14th, stime 15th.
  const size_t close = line.rfind(')');
  std::vector<std::string> f =
      absl::StrSplit(line.substr(close + 2), ' ', absl::SkipEmpty());
  long utime = 0, stime = 0;
  if (f.size() < 13 || !absl::SimpleAtoi(f[11], &utime) ||
      !absl::SimpleAtoi(f[12], &stime)) {
    return absl::InternalError(absl::StrCat("cannot read /proc/", pid, "/stat"));
  }
  s.cpu_seconds = static_cast<double>(utime + stime) /
                  static_cast<double>(sysconf(_SC_CLK_TCK));
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  while (std::getline(status, line)) {
    std::vector<std::string> kv =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (kv.size() < 2) continue;
    if (kv[0] == "VmHWM:") (void)absl::SimpleAtoi(kv[1], &s.rss_kib);
    if (kv[0] == "Threads:") (void)absl::SimpleAtoi(kv[1], &s.threads);
  }
  return s;
}

SimResult RunSim(const SimOptions& options) { return Sim(options).Run(); }

absl::StatusOr<RendezvousProcess> RendezvousProcess::Start(
    const std::string& binary, const std::vector<std::string>& flags,
    const std::string& log_path) {
  int out[2];
  if (pipe(out) != 0) return absl::InternalError("pipe failed");
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    dup2(out[1], 1);
    close(out[0]);
    close(out[1]);
    FILE* log = std::fopen(log_path.c_str(), "w");
    if (log != nullptr) dup2(fileno(log), 2);
    std::vector<std::string> args = {binary, "--listen=127.0.0.1:0"};
    args.insert(args.end(), flags.begin(), flags.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(binary.c_str(), argv.data());
    _exit(127);
  }
  close(out[1]);
  RendezvousProcess p;
  p.pid_ = pid;
  // "halka-rendezvous listening on ADDR"; a process that dies first closes
  // the pipe (EOF).
  std::string text;
  char buf[256];
  while (!absl::StrContains(text, "\n")) {
    const ssize_t got = read(out[0], buf, sizeof(buf));
    if (got <= 0) break;
    text.append(buf, static_cast<size_t>(got));
  }
  close(out[0]);
  const std::string marker = "listening on ";
  const size_t at = text.find(marker);
  if (at == std::string::npos) {
    return absl::UnavailableError(absl::StrCat(
        binary, " did not start (see ", log_path, ")"));
  }
  p.address_ = text.substr(at + marker.size());
  p.address_ = p.address_.substr(0, p.address_.find('\n'));
  return p;
}

RendezvousProcess::RendezvousProcess(RendezvousProcess&& other) noexcept
    : pid_(other.pid_), address_(std::move(other.address_)) {
  other.pid_ = 0;
}

void RendezvousProcess::Stop() {
  if (pid_ <= 0) return;
  kill(pid_, SIGTERM);
  int status = 0;
  for (int i = 0; i < 50; ++i) {
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = 0;
      return;
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  kill(pid_, SIGKILL);
  waitpid(pid_, &status, 0);
  pid_ = 0;
}

}  // namespace halka::scale
