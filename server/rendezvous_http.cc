#include "server/rendezvous_http.h"

#include "absl/strings/str_cat.h"
#include "common/job_state.h"
#include "common/prometheus.h"
#include "google/protobuf/util/json_util.h"
#include "server/ring_page.h"
#include "server/timeline_trace.h"

namespace halka {
namespace {

constexpr v1::JobState kStates[] = {
    v1::JOB_STATE_FORMING, v1::JOB_STATE_HEALTHY, v1::JOB_STATE_DEGRADED,
    v1::JOB_STATE_WAITING};

// Every family of /metrics: name, type, help, in the order written.
constexpr const char* kFamilies[][3] = {
    {"halka_ring_state", "gauge", "1 for the job's current ring state"},
    {"halka_ring_generation", "gauge", "membership generation"},
    {"halka_ring_members", "gauge", "members of the job"},
    {"halka_ring_straggler_rank", "gauge",
     "the rank the others wait on (-1: none)"},
    {"halka_member_alive", "gauge", "1 while the member heartbeats"},
    {"halka_member_heartbeat_age_seconds", "gauge",
     "time since the member's last heartbeat"},
    {"halka_member_operations_total", "counter",
     "operations the member finished, by outcome"},
    {"halka_edge_window_bytes", "gauge",
     "payload bytes over the edge in the last minute"},
    {"halka_edge_throughput_bytes_per_second", "gauge",
     "edge rate over the last minute: bytes over the time the sender's "
     "link was writing them"},
    {"halka_edge_window_wait_seconds", "gauge",
     "time the receiver blocked on the sender in the last minute"},
    {"halka_edge_window_added_wait_seconds", "gauge",
     "wait the ring hop adds (not passed on from upstream), last minute"},
    {"halka_edge_chunk_wait_p50_seconds", "gauge",
     "median per-chunk wait, last minute"},
    {"halka_edge_chunk_wait_p99_seconds", "gauge",
     "99th percentile per-chunk wait, last minute"},
    {"halka_edge_window_errors", "gauge",
     "link errors on the edge in the last minute"},
    {"halka_job_failing", "gauge",
     "1 while the last operation that ended on some live member failed"},
};

void WriteJob(const std::string& job, const v1::RingHealth& h,
              PrometheusWriter& w) {
  const PrometheusWriter::Labels j = {{"halka_job", job}};
  for (v1::JobState s : kStates) {
    w.Sample("halka_ring_state",
             {{"halka_job", job}, {"state", std::string(JobStateName(s))}},
             h.job_state() == s ? 1 : 0);
  }
  w.Sample("halka_ring_generation", j, h.generation());
  w.Sample("halka_ring_members", j, h.members_size());
  w.Sample("halka_ring_straggler_rank", j,
           h.diagnosis().has_straggler() ? h.diagnosis().straggler_rank() : -1);
  w.Sample("halka_job_failing", j, h.failing() ? 1 : 0);
  for (int i = 0; i < h.members_size(); ++i) {
    const v1::Member& m = h.members(i);
    const std::string rank = absl::StrCat(m.rank());
    const PrometheusWriter::Labels l = {
        {"halka_job", job}, {"rank", rank}, {"worker", m.worker_id()}};
    w.Sample("halka_member_alive", l, m.alive() ? 1 : 0);
    w.Sample("halka_member_heartbeat_age_seconds", l, m.last_heartbeat_age_s());
    if (i >= h.telemetry_size()) continue;
    const v1::WorkerTelemetry& t = h.telemetry(i);
    w.Sample("halka_member_operations_total",
             {{"halka_job", job}, {"rank", rank}, {"outcome", "ok"}},
             t.ops_completed());
    w.Sample("halka_member_operations_total",
             {{"halka_job", job}, {"rank", rank}, {"outcome", "error"}},
             t.ops_failed());
  }
  for (const v1::EdgeHealth& e : h.edges()) {
    const PrometheusWriter::Labels l = {{"halka_job", job},
                                        {"from", absl::StrCat(e.from())},
                                        {"to", absl::StrCat(e.to())},
                                        {"ring", e.ring() ? "true" : "false"}};
    w.Sample("halka_edge_window_bytes", l, e.bytes());
    w.Sample("halka_edge_throughput_bytes_per_second", l, e.throughput_bps());
    w.Sample("halka_edge_window_wait_seconds", l, e.wait_seconds());
    w.Sample("halka_edge_window_added_wait_seconds", l, e.added_wait_seconds());
    w.Sample("halka_edge_chunk_wait_p50_seconds", l, e.wait_p50_seconds());
    w.Sample("halka_edge_chunk_wait_p99_seconds", l, e.wait_p99_seconds());
    w.Sample("halka_edge_window_errors", l, e.errors());
  }
}

HttpResponse Json(std::string body) {
  HttpResponse r;
  r.content_type = "application/json";
  r.body = std::move(body);
  return r;
}

// The health of the job named by the query parameter `job`.
grpc::Status HealthOf(RendezvousService& svc,
                      const std::map<std::string, std::string>& params,
                      v1::RingHealth* h) {
  v1::RingHealthRequest req;
  auto it = params.find("job");
  if (it != params.end()) req.set_job_id(it->second);
  return svc.BuildHealth(&req, h);
}

}  // namespace

std::string RendezvousMetrics(RendezvousService& service) {
  PrometheusWriter w;
  for (const auto& f : kFamilies) w.Family(f[0], f[1], f[2]);
  for (const std::string& job : service.JobIds()) {
    v1::RingHealthRequest req;
    req.set_job_id(job);
    v1::RingHealth h;
    if (service.BuildHealth(&req, &h).ok()) WriteJob(job, h, w);
  }
  return w.Text();
}

std::string HealthJson(const v1::RingHealth& h) {
  std::string out;
  google::protobuf::util::JsonPrintOptions jo;
  jo.always_print_primitive_fields = true;
  jo.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(h, &out, jo);
  AddJobStateWord(h.job_state(), &out);
  return out;
}

std::map<std::string, HttpHandler> RendezvousHttpHandlers(
    RendezvousService* svc) {
  std::map<std::string, HttpHandler> handlers;
  handlers["/metrics"] = [svc](const std::map<std::string, std::string>&) {
    HttpResponse r;
    r.content_type = "text/plain; version=0.0.4; charset=utf-8";
    r.body = RendezvousMetrics(*svc);
    return r;
  };
  handlers["/"] = [](const std::map<std::string, std::string>&) {
    HttpResponse r;
    r.content_type = "text/html; charset=utf-8";
    r.body = RingPageHtml();
    return r;
  };
  handlers["/api/jobs"] = [svc](const std::map<std::string, std::string>&) {
    std::string body = "[";
    bool first = true;
    for (const std::string& id : svc->JobIds()) {
      absl::StrAppend(&body, first ? "" : ",", "\"", PromEscape(id), "\"");
      first = false;
    }
    return Json(body + "]");
  };
  handlers["/api/health"] =
      [svc](const std::map<std::string, std::string>& params) {
        v1::RingHealth h;
        grpc::Status st = HealthOf(*svc, params, &h);
        if (st.ok()) return Json(HealthJson(h));
        HttpResponse r = Json(absl::StrCat(
            "{\"error\":\"", PromEscape(st.error_message()), "\"}"));
        r.status = st.error_code() == grpc::StatusCode::NOT_FOUND ? 404 : 400;
        return r;
      };
  // Every live member's timeline as one Chrome trace (halkactl trace); the
  // ring page's timeline view draws it.
  handlers["/api/trace"] =
      [svc](const std::map<std::string, std::string>& params) {
        v1::RingHealth h;
        grpc::Status st = HealthOf(*svc, params, &h);
        absl::StatusOr<std::vector<v1::Timeline>> t =
            st.ok() ? GatherTimelines({h.members().begin(), h.members().end()},
                                      absl::Seconds(3))
                    : absl::StatusOr<std::vector<v1::Timeline>>(
                          FromGrpcStatus(st));
        if (t.ok()) return Json(ChromeTraceJson(*t));
        HttpResponse r = Json(absl::StrCat(
            "{\"error\":\"", PromEscape(std::string(t.status().message())),
            "\"}"));
        r.status = t.status().code() == absl::StatusCode::kNotFound ? 404 : 502;
        return r;
      };
  return handlers;
}

}  // namespace halka
