// Reads what this process logs, for tests that wait on a log line because
// nothing else shows the state they need (a worker that is waiting for its
// parameter server, for one).
//
//   {
//     StderrTap tap;
//     ... start what logs ...
//     ASSERT_TRUE(WaitFor([&] { return tap.Count("waiting for") == 3; },
//                         absl::Seconds(10)));
//   }  // stderr is back, and what was logged meanwhile is written to it
//
// Not thread-safe itself (one thread creates, reads and destroys it); the
// process's writers to stderr may run on any thread.
#ifndef HALKA_TESTS_TESTING_STDERR_TAP_H_
#define HALKA_TESTS_TESTING_STDERR_TAP_H_

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "absl/strings/string_view.h"

namespace halka::testing {

class StderrTap {
 public:
  // From here on, file descriptor 2 writes into a temporary file. ok() says
  // whether that worked (nothing is captured otherwise).
  StderrTap() {
    std::fflush(stderr);
    file_ = std::tmpfile();
    if (file_ == nullptr) return;
    saved_ = ::dup(STDERR_FILENO);
    if (saved_ < 0 || ::dup2(::fileno(file_), STDERR_FILENO) < 0) {
      Close();
    }
  }
  // Restores stderr and writes to it everything captured.
  ~StderrTap() {
    if (saved_ < 0) {
      Close();
      return;
    }
    std::fflush(stderr);
    ::dup2(saved_, STDERR_FILENO);
    const std::string text = Text();
    size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = ::write(STDERR_FILENO, text.data() + done, text.size() - done);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    Close();
  }
  StderrTap(const StderrTap&) = delete;
  StderrTap& operator=(const StderrTap&) = delete;

  bool ok() const { return saved_ >= 0; }

  // Everything written to stderr since the tap was made.
  std::string Text() const {
    std::string text;
    if (file_ == nullptr) return text;
    const int fd = ::fileno(file_);
    struct stat st;
    if (::fstat(fd, &st) != 0) return text;
    text.resize(static_cast<size_t>(st.st_size));
    size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = ::pread(fd, &text[done], text.size() - done,
                                static_cast<off_t>(done));
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    text.resize(done);
    return text;
  }

  // How many times `needle` occurs in Text().
  int Count(absl::string_view needle) const {
    if (needle.empty()) return 0;
    const std::string text = Text();
    int n = 0;
    for (size_t at = text.find(needle.data(), 0, needle.size());
         at != std::string::npos;
         at = text.find(needle.data(), at + needle.size(), needle.size())) {
      ++n;
    }
    return n;
  }

 private:
  void Close() {
    if (saved_ >= 0) ::close(saved_);
    saved_ = -1;
    if (file_ != nullptr) std::fclose(file_);
    file_ = nullptr;
  }

  std::FILE* file_ = nullptr;
  int saved_ = -1;
};

}  // namespace halka::testing

#endif  // HALKA_TESTS_TESTING_STDERR_TAP_H_
