#include "attnprobe/estimators/selection/sharing.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace attnprobe {

void narrow_to_shared(SharedBy by, Capabilities& can) {
  can.shared_by = by;
  if (by != SharedBy::kHead) can.shaping = false;
}

ScoringHeads scoring_heads(const HeadView& view, Share share) {
  ScoringHeads heads;
  if (share == Share::kHead || !view.group || view.group->size() <= 1) {
    heads.rows = {&view.qf};
    heads.prompt = {&view.prompt_qf};
    heads.keys = {&view.kf};
    return heads;
  }
  const QueryGroup& group = *view.group;
  for (int m = 0; m < group.size(); ++m) {
    // A layer's group serves share=group too: its members of the view's kv group.
    const bool own_keys = group.reads_view_keys(m);
    if (share == Share::kGroup && !own_keys) continue;
    heads.rows.push_back(m == group.member ? &view.qf : &group.rows[m]);
    heads.prompt.push_back(m == group.member ? &view.prompt_qf : &group.prompt[m]);
    heads.keys.push_back(own_keys ? &view.kf : group.keys[m].get());
    // The group is cut with the view (view_of_case, last_rows): every head holds the same rows.
    if (heads.rows.back()->rows() != view.n() || heads.prompt.back()->rows() != view.prompt_qf.rows())
      throw std::logic_error("a kv group's query rows were cut apart from its view's");
  }
  return heads;
}

std::vector<double> aggregate_scores(std::vector<std::vector<double>> scores, const std::vector<int64_t>& candidates,
                                     int64_t first, Aggregate agg, bool logits) {
  if (scores.size() == 1) return std::move(scores.front());
  if (agg != Aggregate::kLogit && logits)
    for (std::vector<double>& head : scores) {  // each head's softmax over the candidates
      double top = -INFINITY, total = 0;
      for (int64_t j : candidates) top = std::max(top, head[j - first]);
      for (int64_t j : candidates) total += head[j - first] = std::exp(head[j - first] - top);
      for (int64_t j : candidates) head[j - first] /= total;
    }
  std::vector<double> combined(scores.front().size(), 0.0);
  for (int64_t j : candidates) {
    double value = agg == Aggregate::kMax ? -INFINITY : 0.0;
    for (const std::vector<double>& head : scores)
      value = agg == Aggregate::kMax ? std::max(value, head[j - first]) : value + head[j - first];
    combined[j - first] = agg == Aggregate::kMean ? value / static_cast<double>(scores.size()) : value;
  }
  return combined;
}

}  // namespace attnprobe
