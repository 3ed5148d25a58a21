// A job's membership state (the wire's v1::JobState) as the word people
// read (halkactl health, logs, the ring page's JSON, Prometheus labels);
// the words themselves are halka::JobStateName's (halka/types.h).
// Header-only: every target that includes it links halka::proto and
// halka::types already.
#ifndef HALKA_COMMON_JOB_STATE_H_
#define HALKA_COMMON_JOB_STATE_H_

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/status/statusor.h"
#include "google/protobuf/util/json_util.h"
#include "halka/types.h"
#include "halka/v1/common.pb.h"

namespace halka {

// "forming", "healthy", "degraded", "waiting"; "unspecified" for 0 or a
// value this build does not know. Thread-safe (pure).
inline absl::string_view JobStateName(v1::JobState state) {
  return JobStateName(static_cast<JobState>(state));
}

// JSON for people and scripts keeps the word: inserts `"state":"<word>"`
// (compact) as the first field of the JSON object in `json` (as written by
// MessageToJsonString), next to the enum's own `job_state`. No-op when
// `json` is not an object.
inline void AddJobStateWord(v1::JobState state, std::string* json) {
  const size_t open = json->find('{');
  if (open == std::string::npos) return;
  const size_t next = json->find_first_not_of(" \n\r\t", open + 1);
  const bool empty = next != std::string::npos && (*json)[next] == '}';
  json->insert(open + 1, absl::StrCat("\"state\":\"", JobStateName(state),
                                      "\"", empty ? "" : ","));
}

// A RingHealth reply as `halkactl health --json` prints it (and the Python
// package's Client.ring_health() parses it): indented protobuf JSON with
// the proto's field names, plus the state's word. Works for any message
// with a job_state field (InfoReply too).
template <typename Message>
absl::StatusOr<std::string> JobJson(const Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions jo;
  jo.add_whitespace = true;
  jo.preserve_proto_field_names = true;
  auto st = google::protobuf::util::MessageToJsonString(m, &out, jo);
  if (!st.ok()) {
    return absl::InternalError(absl::StrCat("JSON: ", st.ToString()));
  }
  AddJobStateWord(m.job_state(), &out);
  return out;
}

}  // namespace halka

#endif  // HALKA_COMMON_JOB_STATE_H_
