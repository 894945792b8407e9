#pragma once
// Grouped-query sharing of a selection (docs/estimators/selection.md, "Sharing a kept set over a kv group"): with
// share=head each query head chooses its own keys; with share=group every head of a kv group computes its scores,
// one aggregate of them chooses one kept set per (group, row), and each head still attends it with its own query.
//   agg=mean / max: of the heads' post-softmax weights (a method whose score is a logit first takes each head's
//                   softmax over the candidates it ranks; a score that is a weight already is used as it is);
//   agg=logit:      the sum of the heads' raw scores (logits, or weights for the methods that score by weight).
// A group of one head gives that head's scores unchanged, so share=group equals share=head bit for bit when
// H = Hkv, and a view outside a sweep (no HeadView::group) is its own group of one.
#include <cstdint>
#include <string>
#include <vector>

#include "attnprobe/estimators/capabilities.h"
#include "attnprobe/estimators/param_set.h"
#include "attnprobe/view/head_view.h"

namespace attnprobe {

/// A parameter's `share` is the capability it declares (Capabilities::shared_by): kLayer, every head of the layer with
/// its own kv head's keys, is tova(heads=layer)'s only (no `share` value).
using Share = SharedBy;
enum class Aggregate { kMean, kMax, kLogit };

/// The spec keys `share` and `agg` bound to a parameter struct's `share` and `agg` members, with their help.
template <class P>
ParamSet<P> with_sharing(ParamSet<P>&& set) {
  return std::move(set)
      .choice("share", &P::share, {{"head", Share::kHead}, {"group", Share::kGroup}},
              "head: each query head chooses its keys; group: one choice per kv group, from all its heads' scores")
      .choice("agg", &P::agg, {{"mean", Aggregate::kMean}, {"max", Aggregate::kMax}, {"logit", Aggregate::kLogit}},
              "share=group: mean or max of the heads' weights, or logit: the sum of their raw scores");
}

/// `can` for a setting whose kept sets `by` shares: scores of the other heads' rows would need their own shaping,
/// which the view does not hold.
void narrow_to_shared(SharedBy by, Capabilities& can);

/// A setting's capabilities with share=group: it reads every head of its kv group (Capabilities::shared_by). The
/// declaration's `narrow` of the methods whose only narrowing this is.
template <class P>
void narrow_sharing(const P& params, Capabilities& can) {
  if (params.share == Share::kGroup) narrow_to_shared(SharedBy::kGroup, can);
}

/// The query rows whose scores choose a kept set: the view's own (share=head, or a view without its group), else
/// every head of its kv group (share=group) or of its layer (Share::kLayer) in head order (HeadView::group), the
/// view's own rows at its place; every head's rows and prompt rows as many as the view's.
struct ScoringHeads {
  std::vector<const MatrixF*> rows;    ///< each head's evaluated rows (as view.qf)
  std::vector<const MatrixF*> prompt;  ///< each head's prompt rows (as view.prompt_qf)
  std::vector<const MatrixF*> keys;    ///< the keys each head reads (as view.kf)
  int size() const { return static_cast<int>(rows.size()); }
};
ScoringHeads scoring_heads(const HeadView& view, Share share);

/// One score per key from every head's scores (scores[h][j − first] for key j): only `candidates` (absolute key
/// indices) are aggregated and written; the other entries of the result are unspecified. One head: its scores as
/// they are. `logits`: the scores are logits (turned into a softmax over the candidates before mean / max).
std::vector<double> aggregate_scores(std::vector<std::vector<double>> scores, const std::vector<int64_t>& candidates,
                                     int64_t first, Aggregate agg, bool logits);

}  // namespace attnprobe
