// Log lines to stderr, with no gRPC: "I 20:31:05.123 [tag] message".
#ifndef HALKA_COMMON_LOG_H_
#define HALKA_COMMON_LOG_H_

#include <string>
#include <utility>

#include "absl/strings/string_view.h"

namespace halka {

// One line to stderr: "I 20:31:05.123 [tag] message".
void LogInfo(absl::string_view message);
void LogWarning(absl::string_view message);
void LogError(absl::string_view message);
void SetLogTag(absl::string_view tag);

// Log lines with a tag of their own, for one of several objects that share
// a process (LocalCluster runs its workers in one): "I ... [worker w-2
// rank 2] message", whichever thread writes. An empty tag logs with the
// process's (SetLogTag).
class Logger {
 public:
  explicit Logger(std::string tag = "") : tag_(std::move(tag)) {}
  Logger(const Logger&) = delete;
  Logger& operator=(const Logger&) = delete;

  void SetTag(absl::string_view tag);
  void Info(absl::string_view message) const;
  void Warning(absl::string_view message) const;
  void Error(absl::string_view message) const;

 private:
  friend void LogLine(char, const Logger*, absl::string_view);
  std::string tag_;  // guarded by the log's own mutex
};

}  // namespace halka

#endif  // HALKA_COMMON_LOG_H_
