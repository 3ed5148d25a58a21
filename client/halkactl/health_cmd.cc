#include "client/halkactl/health_cmd.h"

#include <cstdio>
#include <string>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "grpcpp/generic/generic_stub.h"
#include "client/client_proto.h"
#include "client/halkactl/bench.h"
#include "common/grpc_util.h"
#include "common/job_state.h"
#include "halka/client.h"
#include "halka/v1/rendezvous.grpc.pb.h"
#include "server/timeline_trace.h"

ABSL_DECLARE_FLAG(int64_t, count);
ABSL_DECLARE_FLAG(absl::Duration, interval);
ABSL_DECLARE_FLAG(std::string, job);
ABSL_DECLARE_FLAG(bool, json);
ABSL_DECLARE_FLAG(std::string, rendezvous);
ABSL_DECLARE_FLAG(absl::Duration, timeout);
ABSL_DECLARE_FLAG(bool, watch);
ABSL_DECLARE_FLAG(int64_t, watch_count);
ABSL_DECLARE_FLAG(std::string, worker);

namespace halka {
namespace {

absl::StatusOr<v1::RingHealth> RendezvousHealth(const std::string& rendezvous,
                                                const std::string& job) {
  auto stub = v1::Rendezvous::NewStub(MakeChannel(rendezvous));
  grpc::ClientContext ctx;
  SetTimeout(ctx, absl::Seconds(5));
  v1::RingHealthRequest req;
  req.set_job_id(job);
  v1::RingHealth reply;
  grpc::Status s = stub->GetRingHealth(&ctx, req, &reply);
  if (!s.ok()) return FromGrpcStatus(s);
  return reply;
}

// The live members' timelines of `h`, as one Chrome trace in `out` ("-":
// standard output).
}  // namespace

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "halkactl: %s\n", s.ToString().c_str());
  return 1;
}

int WriteTrace(const v1::RingHealth& h, const std::string& out) {
  std::vector<v1::Member> members(h.members().begin(), h.members().end());
  auto timelines = GatherTimelines(members, absl::Seconds(10));
  if (!timelines.ok()) return Fail(timelines.status());
  const std::string json = ChromeTraceJson(*timelines);
  size_t ops = 0;
  for (const v1::Timeline& t : *timelines) ops += t.ops_size();
  if (out == "-") {
    std::fwrite(json.data(), 1, json.size(), stdout);
    return 0;
  }
  FILE* f = std::fopen(out.c_str(), "w");
  if (f == nullptr ||
      std::fwrite(json.data(), 1, json.size(), f) != json.size() ||
      std::fclose(f) != 0) {
    return Fail(absl::UnavailableError(absl::StrCat(
        "trace: cannot write ", out, ": ", std::strerror(errno))));
  }
  std::fprintf(stderr,
               "halkactl: wrote %s: %zu ranks, %zu operations (open it in "
               "chrome://tracing or ui.perfetto.dev)\n",
               out.c_str(), timelines->size(), ops);
  return 0;
}

// `trace`: every live member's timeline, as one Chrome trace in --o.
int Trace(const std::string& rendezvous, const std::string& job,
          const std::string& out) {
  if (rendezvous.empty() || out.empty()) {
    return Fail(absl::InvalidArgumentError(
        "trace needs --rendezvous=ADDR --job=ID -o FILE"));
  }
  absl::StatusOr<v1::RingHealth> h = RendezvousHealth(rendezvous, job);
  if (!h.ok()) return Fail(h.status());
  return WriteTrace(*h, out);
}

static int Health(const std::string& rendezvous, const std::string& job,
           const std::string& worker, bool json) {
  absl::StatusOr<v1::RingHealth> h;
  if (!rendezvous.empty()) {
    h = RendezvousHealth(rendezvous, job);
    if (!h.ok()) return Fail(h.status());
  } else if (!worker.empty()) {
    auto client = Client::Connect(worker);
    if (!client.ok()) return Fail(client.status());
    h = ClientProto::RingHealth(**client);
  } else {
    return Fail(absl::InvalidArgumentError(
        "health needs --rendezvous=ADDR --job=ID or --worker=ADDR"));
  }
  if (!h.ok()) return Fail(h.status());
  if (json) {
    absl::StatusOr<std::string> out = JobJson(*h);
    if (!out.ok()) return Fail(out.status());
    std::printf("%s", out->c_str());
  } else {
    // The first line says the verdict, a failure included.
    std::printf("%s", FormatHealth(ToRingHealth(*h)).c_str());
  }
  std::fflush(stdout);
  return h->job_state() == v1::JOB_STATE_HEALTHY && !h->failing() ? 0 : 2;
}

// `health`, once or (--watch) every --interval, at most --watch_count
// times; the exit status is the last report's.
int HealthCommand() {
  const bool watch = absl::GetFlag(FLAGS_watch);
  const int64_t count = absl::GetFlag(FLAGS_watch_count);
  const absl::CommandLineFlag& elements = absl::GetFlagReflectionHandle(FLAGS_count);
  if (elements.CurrentValue() != elements.DefaultValue()) {
    return Fail(absl::InvalidArgumentError(
        "health: --count is allreduce's element count; the number of "
        "--watch reports is --watch_count=N"));
  }
  if (count < 0) {
    return Fail(absl::InvalidArgumentError("--watch_count must be >= 0"));
  }
  if (count > 0 && !watch) {
    return Fail(absl::InvalidArgumentError("--watch_count needs --watch"));
  }
  int rc = 0;
  for (int i = 0; !watch || count <= 0 || i < count; ++i) {
    if (i > 0) {
      absl::SleepFor(absl::GetFlag(FLAGS_interval));
      std::printf("\n");
    }
    if (watch && !absl::GetFlag(FLAGS_json)) {
      std::printf("# %s\n", absl::FormatTime("%Y-%m-%d %H:%M:%S UTC",
                                                absl::Now(),
                                                absl::UTCTimeZone()).c_str());
    }
    rc = Health(absl::GetFlag(FLAGS_rendezvous), absl::GetFlag(FLAGS_job),
                absl::GetFlag(FLAGS_worker), absl::GetFlag(FLAGS_json));
    if (!watch) break;
  }
  return rc;
}

// grpc.health.v1.Health/Check with hand-encoded messages: the request for
// the overall server status is empty, and the reply is field 1 (status).
int HealthCheck(const std::string& target) {
  if (target.empty()) {
    return Fail(absl::InvalidArgumentError("healthcheck needs --worker=ADDR "
                                           "(any halka server address)"));
  }
  grpc::GenericStub stub(MakeChannel(target));
  grpc::ClientContext ctx;
  SetTimeout(ctx, absl::GetFlag(FLAGS_timeout) < kDefaultOpTimeout
                      ? absl::GetFlag(FLAGS_timeout)
                      : absl::Seconds(3));
  grpc::Slice nothing;
  grpc::ByteBuffer request(&nothing, 1);  // empty HealthCheckRequest
  grpc::ByteBuffer response;
  absl::Notification done;
  grpc::Status status;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(),
                 &request, &response, [&](grpc::Status s) {
                   status = std::move(s);
                   done.Notify();
                 });
  done.WaitForNotification();
  if (!status.ok()) {
    std::printf("%s: %s\n", target.c_str(), status.error_message().c_str());
    return 1;
  }
  std::vector<grpc::Slice> slices;
  response.Dump(&slices);
  std::string bytes;
  for (const auto& sl : slices) bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
  int value = 0;  // UNKNOWN
  if (bytes.size() >= 2 && bytes[0] == 0x08) value = bytes[1];
  static const char* kNames[] = {"UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN"};
  std::printf("%s: %s\n", target.c_str(), value >= 0 && value < 4 ? kNames[value] : "?");
  return value == 1 ? 0 : 1;
}

}  // namespace halka
