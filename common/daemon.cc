#include "common/daemon.h"

#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "common/flags_env.h"
#include "common/grpc_util.h"
#include "common/security.h"
#include "common/signals.h"

namespace halka {

absl::Notification* StartDaemon(int argc, char** argv, absl::string_view usage,
                                absl::string_view tag,
                                const absl::Flag<std::string>* job_flag,
                                std::function<void(int)> also) {
  absl::SetProgramUsageMessage(usage);
  ApplyEnvToFlags();
  absl::ParseCommandLine(argc, argv);
  SetLogTag(tag);
  TuneProcessForStreaming();
  const std::string job = job_flag != nullptr ? absl::GetFlag(*job_flag) : "";
  if (absl::Status s = InitSecurityFromFlags(job); !s.ok()) {
    LogError(s.ToString());
    return nullptr;
  }
  return &InstallTerminationSignals([also = std::move(also)](int sig) {
    LogInfo(absl::StrCat("signal ", sig, ": shutting down"));
    if (also) also(sig);
  });
}

void ExitNow(int code) {
  std::fflush(nullptr);
  std::_Exit(code);
}

}  // namespace halka
