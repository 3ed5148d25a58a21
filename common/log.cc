#include "common/log.h"

#include <cstdio>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace halka {
namespace {

absl::Mutex log_mu;
std::string& LogTag() {
  static std::string* tag = new std::string("halka");
  return *tag;
}

}  // namespace

void LogLine(char level, const Logger* logger, absl::string_view message) {
  const std::string when =
      absl::FormatTime("%H:%M:%E3S", absl::Now(), absl::LocalTimeZone());
  absl::MutexLock lock(&log_mu);
  const std::string& tag =
      logger != nullptr && !logger->tag_.empty() ? logger->tag_ : LogTag();
  std::fprintf(stderr, "%c %s [%s] %.*s\n", level, when.c_str(), tag.c_str(),
               static_cast<int>(message.size()), message.data());
}

void LogInfo(absl::string_view message) { LogLine('I', nullptr, message); }
void LogWarning(absl::string_view message) { LogLine('W', nullptr, message); }
void LogError(absl::string_view message) { LogLine('E', nullptr, message); }
void SetLogTag(absl::string_view tag) {
  absl::MutexLock lock(&log_mu);
  LogTag() = std::string(tag);
}

void Logger::SetTag(absl::string_view tag) {
  absl::MutexLock lock(&log_mu);
  tag_ = std::string(tag);
}
void Logger::Info(absl::string_view message) const { LogLine('I', this, message); }
void Logger::Warning(absl::string_view message) const { LogLine('W', this, message); }
void Logger::Error(absl::string_view message) const { LogLine('E', this, message); }

}  // namespace halka
