#pragma once
// Errors that reach the user. Each class maps to one exit code of DESIGN.md §7, so the CLI
// never has to guess from a message whether a failure was the user's input or our bug.
#include <stdexcept>
#include <string>

namespace attnprobe {

/// Bad input: file, layout, values, or an estimator spec. Exit code 3.
class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Bad command-line usage that CLI11 itself cannot see (e.g. an empty list). Exit code 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace exit_code {
constexpr int kOk = 0;
constexpr int kRegression = 1;
constexpr int kUsage = 2;
constexpr int kInput = 3;
constexpr int kInternal = 4;
}  // namespace exit_code

}  // namespace attnprobe
