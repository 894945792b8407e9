#include "attnprobe/report/table.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>

namespace attnprobe {

std::string format_table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> widths;
  for (const auto& row : rows)
    for (size_t c = 0; c < row.size(); ++c) {
      if (widths.size() <= c) widths.push_back(0);
      widths[c] = std::max(widths[c], row[c].size());
    }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c)
      line += c + 1 == row.size() ? row[c] : fmt::format("{:<{}}  ", row[c], widths[c]);
    out += line + "\n";
  }
  return out;
}

void ProgressBar::update(int64_t done, int64_t total) {
  if (!enabled_ || total <= 0) return;
  const auto now = std::chrono::steady_clock::now();
  if (drawn_ && done < total && now - last_draw_ < std::chrono::milliseconds(100)) return;
  last_draw_ = now;
  drawn_ = true;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double fraction = static_cast<double>(done) / total;
  const int width = 30;
  const int filled = static_cast<int>(fraction * width);
  std::string eta = done > 0 && done < total ? fmt::format(", ~{:.0f} s left", elapsed / done * (total - done)) : "";
  std::fprintf(stderr, "\r[%s%s] %lld/%lld trials, %.1f s%s   ", std::string(filled, '#').c_str(),
               std::string(width - filled, '.').c_str(), static_cast<long long>(done), static_cast<long long>(total),
               elapsed, eta.c_str());
  std::fflush(stderr);
}

void ProgressBar::finish() {
  if (enabled_ && drawn_) std::fprintf(stderr, "\n");
}

}  // namespace attnprobe
