#include "server/timeline_trace.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/grpc_util.h"
#include "halka/v1/worker.grpc.pb.h"

namespace halka {
namespace {

std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        if (c < 0x20) {
          out += absl::StrFormat("\\u%04x", c);
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out + "\"";
}

int TidOf(const v1::TimelineSpan& s) {
  const std::string& k = s.kind();
  if (k == "phase") return 1;
  if (k == "wait") return 2;
  if (k == "reduce") return 3;
  if (k == "send") return 4;
  if (k == "stall") return 5;
  if (k == "window") return 6;
  if (k == "wire") return 100 + std::max(s.peer(), 0);
  return 7;
}

std::string TidName(int tid) {
  switch (tid) {
    case 0:
      return "operations";
    case 1:
      return "phases";
    case 2:
      return "chunk waits";
    case 3:
      return "reduce";
    case 4:
      return "send (hand-off)";
    case 5:
      return "process stalled";
    case 6:
      return "window stall (wire holds the segment)";
    default:
      return tid >= 100 ? absl::StrCat("link to rank ", tid - 100, " writing")
                        : "other";
  }
}

std::string SpanName(const v1::TimelineSpan& s) {
  const std::string& k = s.kind();
  if (k == "phase") return s.phase();
  if (k == "stall") return "stalled";
  if (k == "window") return "window stall";
  if (k == "wire") return absl::StrCat("write to ", s.peer());
  const char* dir = k == "wait" ? " for " : k == "send" ? " to " : " from ";
  return absl::StrCat(k, dir, s.peer(), " (", s.phase(), " step ", s.step(),
                      " chunk ", s.chunk() + 1, ")");
}

}  // namespace

std::string ChromeTraceJson(const std::vector<v1::Timeline>& ranks) {
  int64_t t0 = std::numeric_limits<int64_t>::max();
  for (const v1::Timeline& t : ranks) {
    for (const v1::TimelineOp& op : t.ops()) {
      if (op.start_unix_us() > 0) t0 = std::min(t0, op.start_unix_us());
    }
  }
  if (t0 == std::numeric_limits<int64_t>::max()) t0 = 0;
  std::vector<std::string> events;
  auto event = [&](const std::string& name, const char* cat, int pid, int tid,
                   int64_t from, int64_t to, const std::string& args) {
    events.push_back(absl::StrCat(
        "{\"name\":", Quote(name), ",\"cat\":\"", cat,
        "\",\"ph\":\"X\",\"pid\":", pid, ",\"tid\":", tid,
        ",\"ts\":", from - t0, ",\"dur\":", std::max<int64_t>(to - from, 0),
        ",\"args\":{", args, "}}"));
  };
  auto meta = [&](const char* what, int pid, int tid, const std::string& arg) {
    events.push_back(absl::StrCat("{\"name\":\"", what,
                                  "\",\"ph\":\"M\",\"pid\":", pid,
                                  ",\"tid\":", tid, ",\"args\":{", arg, "}}"));
  };
  for (const v1::Timeline& t : ranks) {
    const int pid = t.rank();
    meta("process_name", pid, 0,
         absl::StrCat("\"name\":",
                      Quote(absl::StrCat("rank ", t.rank(), " (",
                                         t.worker_id(), ")"))));
    meta("process_sort_index", pid, 0, absl::StrCat("\"sort_index\":", pid));
    std::vector<int> tids = {0};
    for (const v1::TimelineOp& op : t.ops()) {
      const std::string op_args = absl::StrCat(
          "\"op_seq\":", op.op_seq(), ",\"generation\":", op.generation());
      event(op.description().empty() ? absl::StrCat("op #", op.op_seq())
                                      : op.description(),
            "op", pid, 0, op.start_unix_us(), op.end_unix_us(),
            absl::StrCat(op_args, ",\"algorithm\":", Quote(op.algorithm()),
                         ",\"ok\":", op.ok() ? "true" : "false",
                         ",\"error\":", Quote(op.error()),
                         ",\"spans_dropped\":", op.spans_dropped()));
      for (const v1::TimelineSpan& s : op.spans()) {
        const int tid = TidOf(s);
        if (std::find(tids.begin(), tids.end(), tid) == tids.end()) {
          tids.push_back(tid);
        }
        event(SpanName(s), s.kind().c_str(), pid, tid, s.start_unix_us(),
              s.end_unix_us(),
              absl::StrCat(op_args, ",\"phase\":", Quote(s.phase()),
                           ",\"step\":", s.step(), ",\"chunk\":", s.chunk(),
                           ",\"peer\":", s.peer(), ",\"bytes\":", s.bytes()));
      }
    }
    for (int tid : tids) {
      meta("thread_name", pid, tid,
           absl::StrCat("\"name\":", Quote(TidName(tid))));
      meta("thread_sort_index", pid, tid,
           absl::StrCat("\"sort_index\":", tid));
    }
  }
  std::string out = "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"t0_unix_us\":";
  absl::StrAppend(&out, t0, "},\"traceEvents\":[\n");
  for (size_t i = 0; i < events.size(); ++i) {
    absl::StrAppend(&out, events[i], i + 1 < events.size() ? ",\n" : "\n");
  }
  out += "]}\n";
  return out;
}

absl::StatusOr<std::vector<v1::Timeline>> GatherTimelines(
    const std::vector<v1::Member>& members, absl::Duration timeout) {
  std::vector<v1::Timeline> out;
  for (const v1::Member& m : members) {
    if (!m.alive()) continue;
    auto stub = v1::Worker::NewStub(MakeChannel(m.address()));
    grpc::ClientContext ctx;
    SetTimeout(ctx, timeout);
    v1::Timeline t;
    grpc::Status s = stub->GetTimeline(&ctx, v1::TimelineRequest(), &t);
    if (!s.ok()) {
      return absl::Status(
          FromGrpcStatus(s).code(),
          absl::StrCat("timeline of rank ", m.rank(), " (", m.worker_id(),
                       ", ", m.address(), "): ", s.error_message()));
    }
    // The member list names the rank this trace is drawn under.
    t.set_rank(m.rank());
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace halka
