#pragma once
// One (layer, head, batch item, length n) slice of a dump: the unit every estimator works on.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "attnprobe/common/matrix.h"
#include "attnprobe/view/mask.h"
#include "attnprobe/view/score_shaping.h"

namespace attnprobe {

struct SliceId {
  int layer = 0;    ///< layer number (NN of layer_NN)
  int head = 0;     ///< head index
  int batch = 0;    ///< batch item index
  int64_t n = 0;    ///< keys used: the prefix 0..n-1 of the keys (self-attention: of the queries too)
  int kv_head = 0;  ///< the kv head whose keys and values the query head reads (GQA: head / (H / Hkv))
};

/// The query rows of the heads whose scores choose a kept set with the view's (in head order): its kv group
/// (share=group), or its whole layer (tova(heads=layer), whose other kv heads bring their keys), for the methods
/// that choose one kept set for several heads (docs/estimators/selection.md): each member's rows as the view's own
/// (qf: the evaluated rows; prompt: the rows before them, as prompt_qf). The view's own head, at `member`, is left
/// empty here: its rows are the view's qf and prompt_qf, so a view whose own data is replaced stays consistent.
struct QueryGroup {
  std::vector<MatrixF> rows, prompt;
  /// Each member's keys (as the view's kf: keys × p, float32) when it reads another kv head than the view; null for
  /// the members of the view's kv group, which read the view's keys. Members of one kv head share one matrix.
  std::vector<std::shared_ptr<const MatrixF>> keys;
  int member = 0;  ///< the view's own head among them
  int size() const { return static_cast<int>(rows.size()); }
  /// Whether member m reads the view's keys (is in the view's kv group).
  bool reads_view_keys(int m) const { return keys.empty() || !keys[m]; }
};

/// The data of one slice in both precisions: float64 exactly as stored (the reference and the
/// metrics use it) and float32 (what estimators compute with, as an efficient kernel would).
/// Query row i is at absolute position position(i) among the keys 0..keys()−1 (self-attention: i); the
/// mask says which keys each row sees (QueryGeometry, mask.h).
struct HeadView {
  SliceId id;
  double scale = 0;                ///< s in softmax(s·QKᵀ)
  Mask mask = Mask::kFull;         ///< causal: row i of every estimate may depend on tokens 0..position(i) only
  int64_t window = 0;              ///< W of Mask::kWindow
  int64_t first_position = 0;      ///< row i at position first_position + i, unless `positions` is given
  std::vector<int64_t> positions;  ///< explicit positions of the query rows (strictly increasing), or empty
  MatrixD q, k, v;                 ///< rows × p, keys × p, keys × pv (float64)
  MatrixF qf, kf, vf;              ///< the same in float32
  /// The query rows at positions 0..first_position − 1 when the view is the last rows of a self-attention
  /// slice (last_rows): the prompt, whose queries estimators that compress the cache once read (float32, as
  /// the selection scores widen it). Empty for a whole slice and for a dump that stores only its decode rows.
  MatrixF prompt_qf;
  /// The prompt's end when lowered below the first evaluated row (--prefill P; the rows between are decode steps
  /// that are not evaluated), else −1: see prompt_end().
  int64_t prefill = -1;
  /// The query rows of the other heads of its kv group (share=group) or layer (tova(heads=layer)), when a setting
  /// chooses keys for several heads; null otherwise, and outside a sweep, where a view is its own group of one.
  std::shared_ptr<const QueryGroup> group;
  /// What the model adds to or does with the scores before the softmax (bias, ALiBi, soft-cap); none by default.
  ScoreShaping shaping;
  /// The rotary embedding's inverse frequencies θ_f (P/2 of them, rotate_half pairing of channels f and f + P/2)
  /// when the dump gives them (docs/dumps.md, "Rotary frequencies"); null otherwise. The dumped q and k are rotated
  /// already: this is only for the estimators that undo the rotation (expected(stats=rope)).
  std::shared_ptr<const std::vector<double>> rope_inv_freq;

  int64_t n() const { return q.rows(); }  ///< query rows
  int64_t keys() const { return k.rows(); }
  int64_t p() const { return q.cols(); }
  int64_t pv() const { return v.cols(); }
  QueryGeometry geometry() const { return {mask, window, first_position, positions.empty() ? nullptr : &positions}; }
  int64_t position(int64_t row) const { return geometry().position(row); }
  /// P, where the prompt of the estimators that compress it once or replay a cache from it ends: `prefill` when
  /// lowered, else the first evaluated row's position.
  int64_t prompt_end() const {
    return prefill >= 0 ? prefill : (positions.empty() ? first_position : positions.front());
  }
  KeyRange visible(int64_t row) const { return geometry().visible(row, keys()); }
  /// Whether queries and keys are the same tokens (row i at position i, as many rows as keys).
  bool self_attention() const { return positions.empty() && first_position == 0 && q.rows() == k.rows(); }
};

/// Builds a view from float64 matrices (fills the float32 copies): self-attention under `mask`.
HeadView make_head_view(SliceId id, double scale, MatrixD q, MatrixD k, MatrixD v, Mask mask = Mask::kFull);

/// A view of other data with the geometry of `like` (its id, scale, mask, window and query positions).
HeadView with_data(const HeadView& like, MatrixD q, MatrixD k, MatrixD v);

/// The last `rows` query rows of a self-attention view against all of its keys: rows at positions
/// keys − rows..keys − 1 (a decode step of `rows` queries with the slice as its cache), same mask; the rows
/// before them become its prompt_qf.
HeadView last_rows(const HeadView& whole, int64_t rows);

/// A group from every member head's query rows as read (`rows[member]` unused), cut to the first `n` rows as a
/// prefix of a self-attention slice cuts its own (a decode dump's rows, fewer than its keys, stay whole). last_rows
/// cuts a view's group with it. `keys`: each member's keys as read when it reads another kv head than the view
/// (null for the view's kv group; empty: every member reads the view's), cut to their first `n` rows.
std::shared_ptr<const QueryGroup> prefix_group(const std::vector<const MatrixF*>& rows, int member, int64_t n,
                                               const std::vector<const MatrixF*>& keys = {});

/// Finite values can still overflow what the estimators compute in float32 (squared norms, scores
/// s·q·k and their exponentials) and turn every metric into NaN. "" when q, k, v and scale stay within
/// a row norm of 1e18 and a score s·|q|·|k| of 1e30; else what exceeds them, with the figures and the
/// limits (the dump readers and the Python entry points refuse such slices). Each row norm is bounded
/// by max|x|·√width, which cannot itself overflow.
std::string magnitude_problem(const MatrixD& q, const MatrixD& k, const MatrixD& v, double scale);

/// "" when `inv_freq` can be the rotary inverse frequencies of a head of dim p (HeadView::rope_inv_freq): p even, p/2
/// values, each finite in [0, 1e6]; else what is wrong, naming the first bad value by its index (the dump readers
/// and the Python Slice refuse them).
std::string rotary_frequencies_problem(const std::vector<double>& inv_freq, int64_t p);

}  // namespace attnprobe
