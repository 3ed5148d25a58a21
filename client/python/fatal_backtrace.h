// An opt-in native stack dump on a fatal signal (HALKA_NATIVE_BACKTRACE=1
// when the halka module is imported): SIGABRT (glibc's "double free or
// corruption" aborts), SIGSEGV and SIGBUS print the signalled thread's
// native frames (module and offset: `addr2line -e <module> <offset>`
// names the line) to stderr, then the signal takes its default action, so
// the process still dies of it. A diagnosis aid for crashes that Python's
// faulthandler shows only as Python frames; it replaces any handler
// installed before it (torch's own, which in a forked test process can
// hang instead of exiting). Limits: snprintf and backtrace are not
// async-signal-safe (the unwinder is loaded at install, which avoids the
// usual deadlock; a corrupted heap may still defeat it), there is no
// alternate signal stack (a stack overflow prints nothing), and a handler
// installed before it (Python's faulthandler) is replaced, not chained.
#ifndef HALKA_CLIENT_PYTHON_FATAL_BACKTRACE_H_
#define HALKA_CLIENT_PYTHON_FATAL_BACKTRACE_H_

#include <execinfo.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace halka {

inline void FatalBacktrace(int sig) {
  char head[128];
  const int n = std::snprintf(
      head, sizeof head,
      "halka: fatal signal %d (%s) in thread %ld of process %ld; its native "
      "stack:\n",
      sig, sig == SIGABRT ? "SIGABRT" : sig == SIGSEGV ? "SIGSEGV" : "SIGBUS",
      static_cast<long>(syscall(SYS_gettid)), static_cast<long>(getpid()));
  if (n > 0) (void)!write(STDERR_FILENO, head, static_cast<size_t>(n));
  void* frames[64];
  const int k = backtrace(frames, 64);
  backtrace_symbols_fd(frames, k, STDERR_FILENO);
  signal(sig, SIG_DFL);
  raise(sig);
}

// Installs the handler where HALKA_NATIVE_BACKTRACE is "1"; true if it did.
inline bool InstallFatalBacktraceFromEnv() {
  const char* on = std::getenv("HALKA_NATIVE_BACKTRACE");
  if (on == nullptr || std::strcmp(on, "1") != 0) return false;
  void* prime[1];
  backtrace(prime, 1);  // loads the unwinder now, not inside the handler
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = FatalBacktrace;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND | SA_NODEFER;
  for (int s : {SIGABRT, SIGSEGV, SIGBUS}) sigaction(s, &sa, nullptr);
  return true;
}

}  // namespace halka

#endif  // HALKA_CLIENT_PYTHON_FATAL_BACKTRACE_H_
