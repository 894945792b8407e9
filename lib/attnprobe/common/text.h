#pragma once
// Small text helpers shared by the CLI, the CSV reader and the spec parser.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace attnprobe {

/// Splits on `sep`, keeping empty fields.
std::vector<std::string> split(std::string_view text, char sep);
std::string trim(std::string_view text);
std::string join(const std::vector<std::string>& parts, std::string_view sep);

/// Parses a list of non-negative integers: "8,16,32", ranges "8..128" (step 1), "8..128:x2"
/// (geometric) and "0..10:+2" (arithmetic), mixed with commas. Throws UsageError naming `what`.
std::vector<int64_t> parse_int_list(std::string_view text, std::string_view what);

/// Strict integer and real parsing (whole string, no trailing junk); nullopt-like via bool.
bool parse_int(std::string_view text, int64_t& out);
bool parse_real(std::string_view text, double& out);

/// Edit distance between a and b ignoring ASCII case: insertions, deletions, substitutions and swaps of
/// two adjacent characters each cost 1 (optimal string alignment), so `--trails` is 1 from `--trials`.
/// Cost O(|a| · |b|).
size_t edit_distance(std::string_view a, std::string_view b);

/// The candidate nearest to `word` by edit_distance when it is near enough to be a typo of it: at most
/// max(1, |word| / 3) edits, and fewer edits than `word` has characters (a one-letter word suggests only
/// itself in another case: `m` finds `M`, `x` finds nothing). Ties go to the earlier candidate; "" if none.
std::string nearest_name(std::string_view word, const std::vector<std::string>& candidates);

/// " Did you mean 'NAME'?" for nearest_name, or "" when nothing is near: appended to "unknown ..." errors.
std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates);

/// Shortest decimal that round-trips a double ("{}" in fmt), with nan/inf spelled out.
std::string format_real(double value);

/// 64-bit FNV-1a of `text`, continuing from `state` (the offset basis to start; a previous call's result
/// to hash a long input in parts): run.json's plan fingerprint and the dump digest.
constexpr uint64_t kFnv1aStart = 0xcbf29ce484222325ULL;
uint64_t fnv1a(std::string_view text, uint64_t state = kFnv1aStart);

/// fnv1a followed by a splitmix64 finaliser: stable across platforms and builds, used to key randomness
/// by the canonical case id (docs/randomness.md).
uint64_t stable_hash(std::string_view text);

}  // namespace attnprobe
