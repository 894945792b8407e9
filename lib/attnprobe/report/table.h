#pragma once
// Human-facing output on the terminal: aligned tables and a progress bar.
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace attnprobe {

/// Prints rows as left-aligned columns separated by two spaces; the first row is the header.
std::string format_table(const std::vector<std::vector<std::string>>& rows);

/// A one-line progress bar on stderr, redrawn at most 10 times a second; silent unless enabled
/// (the CLI enables it when stderr is a terminal).
class ProgressBar {
 public:
  explicit ProgressBar(bool enabled) : enabled_(enabled), start_(std::chrono::steady_clock::now()) {}
  void update(int64_t done, int64_t total);
  void finish();

 private:
  bool enabled_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_{};
};

}  // namespace attnprobe
