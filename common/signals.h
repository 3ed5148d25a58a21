// Clean shutdown on SIGTERM/SIGINT without work in a signal handler: the
// signals are blocked in every thread and a dedicated (detached) thread
// waits for them with sigwait. The main thread waits on the notification
// and then shuts its server down itself, so no two threads ever tear the
// same object down.
#ifndef HALKA_COMMON_SIGNALS_H_
#define HALKA_COMMON_SIGNALS_H_

#include <csignal>
#include <functional>
#include <thread>

#include "absl/synchronization/notification.h"

namespace halka {

// Call first thing in main, before any thread starts. On the first signal,
// `on_signal` (if any) runs on the signal thread, then the returned
// notification fires. The notification lives for the whole process.
inline absl::Notification& InstallTerminationSignals(
    std::function<void(int)> on_signal = nullptr) {
  static absl::Notification* received = new absl::Notification();
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread([set, on_signal] {
    int sig = 0;
    sigwait(&set, &sig);
    if (on_signal) on_signal(sig);
    received->Notify();
  }).detach();
  return *received;
}

}  // namespace halka

#endif  // HALKA_COMMON_SIGNALS_H_
