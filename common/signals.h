// Blocks SIGTERM/SIGINT in every thread and waits for one on a dedicated
// thread, so daemons shut down cleanly instead of dying mid-write.
#ifndef HALKA_COMMON_SIGNALS_H_
#define HALKA_COMMON_SIGNALS_H_

#include <csignal>
#include <functional>
#include <thread>

namespace halka {

// Call first thing in main (before any thread starts). `on_signal` runs on
// the waiting thread with the signal number.
inline std::thread HandleTerminationSignals(std::function<void(int)> on_signal) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return std::thread([set, on_signal] {
    int sig = 0;
    sigwait(&set, &sig);
    on_signal(sig);
  });
}

}  // namespace halka

#endif  // HALKA_COMMON_SIGNALS_H_
