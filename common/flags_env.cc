#include "common/flags_env.h"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/flags/reflection.h"
#include "absl/strings/ascii.h"

namespace halka {

void ApplyEnvToFlags() {
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    const std::string var = "HALKA_" + absl::AsciiStrToUpper(std::string(name));
    const char* value = std::getenv(var.c_str());
    if (value == nullptr) continue;
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      std::fprintf(stderr, "%s=%s: %s\n", var.c_str(), value, error.c_str());
      std::exit(2);
    }
  }
}

}  // namespace halka
