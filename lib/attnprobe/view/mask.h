#pragma once
// The attention mask of a case and the positions of its query rows: which keys each query attends to
// (docs/specs.md, "Masks"; the geometry of queries ≠ keys, docs/dumps.md).
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace attnprobe {

/// All keys (`full`, bidirectional: encoders and cross-attention), keys 0..t (`causal`: decoders), or keys
/// t−W+1..t (`window:W`: sliding-window decoders such as Mistral's), for the query at absolute position t.
/// The mask is part of the case: the reference is the softmax with this mask, and only estimators that
/// declare a form for it may run under it.
enum class Mask { kFull, kCausal, kWindow };

/// "full" | "causal" | "window" (the kind; with its width: mask_text).
const char* mask_name(Mask mask);
/// The CSV's `mask` column and the case id's `;mask=…`: "full", "causal" or "window:W".
std::string mask_text(Mask mask, int64_t window);
/// Parses "full" | "causal" | "window:W" (W ≥ 1); nullopt for anything else.
struct MaskSpec {
  Mask mask = Mask::kFull;
  int64_t window = 0;  ///< W for kWindow, else 0
};
std::optional<MaskSpec> parse_mask(std::string_view text);

/// Which query rows of a slice a case evaluates (docs/specs.md, "Geometry"): every row (`all`, self-attention),
/// the last W rows against all the slice's keys (`last:W`: W decode steps with the rest as their cache), or the
/// query rows a dump stores itself when it has fewer than its keys (`dump`).
struct QueryRows {
  enum class Kind { kAll, kLast, kDump };
  Kind kind = Kind::kAll;
  int64_t last = 0;  ///< W of kLast, else 0
  /// The prompt's end P when lowered below the first evaluated row (--prefill P, kLast only): the rows P..N − W − 1
  /// become decode steps that are not evaluated (estimators that compress a prompt or replay a cache). −1: the
  /// first evaluated row, N − W.
  int64_t prefill = -1;

  bool all() const { return kind == Kind::kAll; }
  auto operator<=>(const QueryRows&) const = default;
  bool operator==(const QueryRows&) const = default;
};
/// The CSV's `queries` column and the case id's `;queries=…`: "all", "last:W", "last:W;prefill=P" or "dump".
std::string query_rows_text(QueryRows rows);
/// Parses "all" | "last:W" (W ≥ 1) | "last:W;prefill=P" (P ≥ 0) | "dump"; nullopt for anything else.
std::optional<QueryRows> parse_query_rows(std::string_view text);

/// Keys [begin, end) of a row.
struct KeyRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};

/// The keys a query at absolute position `position` sees among `keys` keys at positions 0..keys−1.
inline KeyRange visible_range(int64_t position, int64_t keys, Mask mask, int64_t window) {
  switch (mask) {
    case Mask::kCausal:
      return {0, std::min(position + 1, keys)};
    case Mask::kWindow:
      return {std::clamp<int64_t>(position - window + 1, 0, keys), std::min(position + 1, keys)};
    case Mask::kFull:
      break;
  }
  return {0, keys};
}

/// Which keys each query row of a slice sees: the mask and the absolute positions of the rows. Row i is at
/// position positions[i] when `positions` is given (strictly increasing), else at first_position + i —
/// 0 for self-attention, keys − rows for the last rows against a longer cache (bottom-right alignment).
struct QueryGeometry {
  Mask mask = Mask::kFull;
  int64_t window = 0;
  int64_t first_position = 0;
  const std::vector<int64_t>* positions = nullptr;

  int64_t position(int64_t row) const { return positions ? (*positions)[row] : first_position + row; }
  KeyRange visible(int64_t row, int64_t keys) const { return visible_range(position(row), keys, mask, window); }
  /// Whether rows are consecutive positions (first_position + i).
  bool contiguous() const { return positions == nullptr; }
};

}  // namespace attnprobe
