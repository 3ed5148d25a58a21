// Every daemon flag can also come from the environment: --foo_bar reads
// HALKA_FOO_BAR when the command line does not set it. Containers then need
// no command-line templating.
#ifndef HALKA_COMMON_FLAGS_ENV_H_
#define HALKA_COMMON_FLAGS_ENV_H_

namespace halka {

// Call before absl::ParseCommandLine: sets the default of every registered
// flag whose HALKA_<NAME> variable is set. Exits with a message when a
// variable does not parse.
void ApplyEnvToFlags();

}  // namespace halka

#endif  // HALKA_COMMON_FLAGS_ENV_H_
