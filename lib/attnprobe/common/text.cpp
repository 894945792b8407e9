#include "attnprobe/common/text.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include "attnprobe/common/error.h"

namespace attnprobe {

std::vector<std::string> split(std::string_view text, char sep) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    size_t pos = text.find(sep, start);
    if (pos == std::string_view::npos) {
      parts.emplace_back(text.substr(start));
      return parts;
    }
    parts.emplace_back(text.substr(start, pos - start));
    start = pos + 1;
  }
}

std::string trim(std::string_view text) {
  size_t b = 0, e = text.size();
  while (b < e && std::isspace(static_cast<unsigned char>(text[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(text[e - 1]))) --e;
  return std::string(text.substr(b, e - b));
}

std::string join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) out += sep;
    out += parts[i];
  }
  return out;
}

bool parse_int(std::string_view text, int64_t& out) {
  std::string s = trim(text);
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || end != s.c_str() + s.size()) return false;
  out = v;
  return true;
}

bool parse_real(std::string_view text, double& out) {
  std::string s = trim(text);
  // Decimal only: hex floats (0x1p3) are nothing attnprobe writes. from_chars, not strtod: strtod reads
  // the C locale's decimal point, which a host process (Python under de_DE) may have made a comma.
  if (s.empty() || s.find_first_of("xX") != std::string::npos) return false;
  const char* first = s.data();
  const char* last = s.data() + s.size();
  if (*first == '+' && s.size() > 1 && first[1] != '-') ++first;  // strtod took a leading '+'
  double v = 0;
  const auto [end, error] = std::from_chars(first, last, v, std::chars_format::general);
  if (end != last) return false;
  if (error == std::errc::result_out_of_range) {
    // An underflow is a valid value (lara(beta=1e-400) is 0): the exponent is negative. An overflow is not.
    const size_t e = s.find_first_of("eE");
    if (e == std::string::npos || s.find('-', e) != e + 1) return false;
    v = s.find('-') < e ? -0.0 : 0.0;
  } else if (error != std::errc()) {
    return false;
  }
  out = v;
  return true;
}

std::vector<int64_t> parse_int_list(std::string_view text, std::string_view what) {
  auto fail = [&](const std::string& why) {
    return UsageError(
        fmt::format("cannot read the {} list '{}': {}. Write values like 8,16,32, a range 8..128, a doubling range "
                    "8..128:x2 or a stepped range 0..12:+4.",
                    what, text, why));
  };
  // Every loop below is overflow-checked (a bound near 2^63 must end the range, not wrap it), and
  // the list as a whole is capped, so no text can grow it without bound.
  constexpr size_t kMaxValues = 1000000;
  std::vector<int64_t> values;
  auto push = [&](int64_t v) {
    if (values.size() >= kMaxValues) throw fail(fmt::format("it has more than {} values", kMaxValues));
    values.push_back(v);
  };
  if (trim(text).empty()) throw fail("it is empty");
  for (const std::string& raw : split(text, ',')) {
    std::string item = trim(raw);
    if (item.empty()) throw fail("an item is empty");
    size_t dots = item.find("..");
    if (dots == std::string::npos) {
      int64_t v;
      if (!parse_int(item, v) || v < 0) throw fail(fmt::format("'{}' is not a non-negative integer", item));
      push(v);
      continue;
    }
    std::string lo_text = item.substr(0, dots);
    std::string rest = item.substr(dots + 2);
    std::string step_text;
    if (size_t colon = rest.find(':'); colon != std::string::npos) {
      step_text = rest.substr(colon + 1);
      rest = rest.substr(0, colon);
    }
    int64_t lo, hi;
    if (!parse_int(lo_text, lo) || !parse_int(rest, hi) || lo < 0 || hi < lo)
      throw fail(fmt::format("'{}' is not a range lo..hi with 0 <= lo <= hi", item));
    if (step_text.empty() || step_text[0] == '+') {
      int64_t step = 1;
      if (!step_text.empty() && (!parse_int(step_text.substr(1), step) || step < 1))
        throw fail(fmt::format("'{}' has a bad step (use :+K with K >= 1)", item));
      if ((hi - lo) / step >= static_cast<int64_t>(kMaxValues))
        throw fail(fmt::format("the range has more than {} values", kMaxValues));
      for (int64_t v = lo;; v += step) {
        push(v);
        if (hi - v < step) break;  // the next value would pass hi (or overflow)
      }
    } else if (step_text[0] == 'x') {
      int64_t factor;
      if (!parse_int(step_text.substr(1), factor) || factor < 2 || lo < 1)
        throw fail(fmt::format("'{}' has a bad factor (use :xK with K >= 2 and a start >= 1)", item));
      for (int64_t v = lo;; v *= factor) {
        push(v);
        if (v > hi / factor) break;  // v·factor > hi, or would overflow
      }
    } else {
      throw fail(fmt::format("'{}' has a step that is neither :+K nor :xK", item));
    }
  }
  return values;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  auto lower = [](char c) { return static_cast<char>(std::tolower(static_cast<unsigned char>(c))); };
  // Three rows of the (|a|+1) × (|b|+1) table: the swap of two adjacent characters looks two rows back.
  std::vector<size_t> before(b.size() + 1), above(b.size() + 1), row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) above[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const bool same = lower(a[i - 1]) == lower(b[j - 1]);
      row[j] = std::min({above[j] + 1, row[j - 1] + 1, above[j - 1] + (same ? 0 : 1)});
      if (i > 1 && j > 1 && lower(a[i - 1]) == lower(b[j - 2]) && lower(a[i - 2]) == lower(b[j - 1]))
        row[j] = std::min(row[j], before[j - 2] + 1);
    }
    std::swap(before, above);
    std::swap(above, row);
  }
  return above[b.size()];
}

std::string nearest_name(std::string_view word, const std::vector<std::string>& candidates) {
  const size_t allowed = std::max<size_t>(1, word.size() / 3);
  std::string best;
  size_t best_distance = allowed + 1;
  for (const std::string& candidate : candidates) {
    const size_t d = edit_distance(word, candidate);
    if (d < best_distance && d < word.size()) {
      best = candidate;
      best_distance = d;
    }
  }
  return best;
}

std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates) {
  const std::string name = nearest_name(word, candidates);
  return name.empty() ? std::string() : fmt::format(" Did you mean '{}'?", name);
}

std::string format_real(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  return fmt::format("{}", value);
}

uint64_t fnv1a(std::string_view text, uint64_t state) {
  for (unsigned char c : text) {
    state ^= c;
    state *= 0x100000001b3ULL;
  }
  return state;
}

uint64_t stable_hash(std::string_view text) {
  uint64_t h = fnv1a(text);
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ULL;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebULL;
  h ^= h >> 31;
  return h;
}

}  // namespace attnprobe
