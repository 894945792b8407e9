#pragma once
// Errors that reach the user. Each class maps to one exit code (docs/cli.md, "Exit codes"), so the
// CLI never has to guess from a message whether a failure was the user's input or our bug.
#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <utility>

namespace attnprobe {

/// Bad input: a file, its layout or values, or a resource limit (memory, a kernel's maximum size). Exit code 3.
class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Bad command-line usage that CLI11 itself cannot see: lists, estimator specs, a device or mask an
/// estimator cannot do. Exit code 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A run stopped on request (Ctrl-C, SIGTERM, Python's KeyboardInterrupt) before it finished: what it
/// had computed is written, and `sweep --resume` completes it. Exit code 130 (128 + SIGINT, the shell's).
class Interrupted : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The one way library code rejects bad input: throws InputError with the formatted message unless `ok`.
/// The message says what was wrong, where (file, dataset, layer, batch item) and what to do.
template <class... Args>
void require_input(bool ok, fmt::format_string<Args...> format, Args&&... args) {
  if (!ok) throw InputError(fmt::format(format, std::forward<Args>(args)...));
}

/// The same for usage errors (exit 2).
template <class... Args>
void require_usage(bool ok, fmt::format_string<Args...> format, Args&&... args) {
  if (!ok) throw UsageError(fmt::format(format, std::forward<Args>(args)...));
}

namespace exit_code {
constexpr int kOk = 0;
constexpr int kRegression = 1;
constexpr int kUsage = 2;
constexpr int kInput = 3;
constexpr int kInternal = 4;
constexpr int kInterrupted = 130;
}  // namespace exit_code

}  // namespace attnprobe
