#include "attnprobe/estimators/selection/duo/duo.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <memory>
#include <tuple>

#include "attnprobe/common/error.h"
#include "attnprobe/common/text.h"
#include "attnprobe/estimators/registry.h"
#include "attnprobe/estimators/selection/kept_keys.h"

namespace attnprobe {

std::vector<std::vector<double>> read_duo_pattern(const std::string& path) {
  std::ifstream in(path);
  require_input(static_cast<bool>(in),
                "duo: cannot open the pattern file '{}'. Give the path of a DuoAttention "
                "full_attention_heads.tsv (one line per layer, one tab-separated value per kv head).",
                path);
  std::vector<std::vector<double>> alpha;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    require_input(!trim(line).empty(), "duo: '{}' line {} is empty; the pattern has one line per layer.", path, number);
    std::vector<double> row;
    for (const std::string& field : split(trim(line), '\t')) {
      double value = 0;
      require_input(parse_real(trim(field), value) && std::isfinite(value),
                    "duo: '{}' line {}: '{}' is not a finite number (values are tab-separated, one per kv head).", path,
                    number, field);
      row.push_back(std::clamp(value, 0.0, 1.0));
    }
    require_input(alpha.empty() || row.size() == alpha.front().size(),
                  "duo: '{}' line {} has {} values, line 1 has {}: every layer has the same kv heads.", path, number,
                  row.size(), alpha.empty() ? 0 : alpha.front().size());
    alpha.push_back(std::move(row));
  }
  require_input(!alpha.empty(), "duo: the pattern file '{}' is empty.", path);
  return alpha;
}

namespace {

// The labels of every (layer, kv head): α, and whether the pair streams.
struct HeadLabels {
  std::vector<std::vector<double>> alpha;
  std::vector<std::vector<char>> streams;
};

HeadLabels label_heads(const DuoParams& o) {
  HeadLabels labels;
  labels.alpha = read_duo_pattern(o.pattern);
  const int64_t layers = static_cast<int64_t>(labels.alpha.size()), kv = static_cast<int64_t>(labels.alpha[0].size());
  labels.streams.assign(layers, std::vector<char>(kv, 0));
  if (o.fraction < 0) {
    for (int64_t l = 0; l < layers; ++l)
      for (int64_t g = 0; g < kv; ++g) labels.streams[l][g] = labels.alpha[l][g] < o.threshold;
    return labels;
  }
  std::vector<std::tuple<double, int64_t, int64_t>> pairs;
  for (int64_t l = 0; l < layers; ++l)
    for (int64_t g = 0; g < kv; ++g) pairs.emplace_back(labels.alpha[l][g], l, g);
  std::sort(pairs.begin(), pairs.end());
  const auto streamed = static_cast<size_t>(std::floor(o.fraction * static_cast<double>(pairs.size())));
  for (size_t r = 0; r < std::min(streamed, pairs.size()); ++r)
    labels.streams[std::get<1>(pairs[r])][std::get<2>(pairs[r])] = 1;
  return labels;
}

class Duo final : public KeptKeysEstimator {
 public:
  explicit Duo(DuoParams params)
      : params_(std::move(params)),
        labels_(params_.pattern.empty() ? nullptr : std::make_shared<const HeadLabels>(label_heads(params_))) {}

  KeptRows kept_keys(const HeadView& view, const EstimateContext&) const override {
    const int64_t sink = params_.sink, window = params_.window;
    if (labels_) check_labelled(view);
    // Without a pattern every head streams (and mix, a blend by α, has no α).
    const bool streams = !labels_ || labels_->streams[view.id.layer][view.id.kv_head];
    if (!params_.mix || !labels_)
      return [&view, streams, sink, window](int64_t i) {
        const KeyRange seen = view.visible(i);
        KeptKeys kept{{}, {}};
        if (streams)
          kept.keys = sink_and_window(seen, view.position(i), sink, window);
        else
          append_range(kept.keys, seen.begin, seen.end);
        return kept;
      };
    // The blend Â = α·a + (1 − α)·â_streaming(window − 1) over every visible key, as log-weights ω = log Â − ℓ.
    const double alpha = labels_->alpha[view.id.layer][view.id.kv_head];
    return [&view, alpha, sink, window](int64_t i) {
      const KeyRange seen = view.visible(i);
      const std::vector<double> logits = score_visible(view, i);
      const std::vector<int64_t> streamed = sink_and_window(seen, view.position(i), sink, window - 1);
      const double top = *std::max_element(logits.begin(), logits.end());
      double all = 0, part = 0;
      for (double l : logits) all += std::exp(l - top);
      for (int64_t j : streamed) part += std::exp(logits[j - seen.begin] - top);
      KeptKeys kept{{}, {}};
      size_t s = 0;
      for (int64_t j = seen.begin; j < seen.end; ++j) {
        const double e = std::exp(logits[j - seen.begin] - top);
        const bool in_window = s < streamed.size() && streamed[s] == j;
        s += in_window;
        const double weight = alpha * e / all + (in_window ? (1 - alpha) * e / part : 0.0);
        if (weight <= 0) continue;  // α = 0 outside the streaming keys
        kept.keys.push_back(j);
        kept.log_weights.push_back(std::log(weight) - (logits[j - seen.begin] - top));
      }
      return kept;
    };
  }
  double flops(int64_t n, int64_t p, int64_t pv) const override {
    // Without a pattern every head streams; with one, a retrieval head (and every head under mix) reads all keys.
    const double kept =
        labels_ ? static_cast<double>(n) : static_cast<double>(std::min(n, params_.sink + params_.window));
    return 2.0 * n * kept * (p + pv);
  }

 private:
  // A pattern labels (layer, kv head) pairs: the view must carry them (a dump's slice) and the pattern cover them.
  void check_labelled(const HeadView& view) const {
    require_input(view.id.n > 0,
                  "duo(pattern={}) labels heads by their layer and kv head, which a slice outside a "
                  "dump does not carry: measure it with eval or sweep on a dump.",
                  params_.pattern);
    const int layer = view.id.layer, kv = view.id.kv_head;
    require_input(layer < static_cast<int>(labels_->alpha.size()) && kv < static_cast<int>(labels_->alpha[0].size()),
                  "duo: the pattern '{}' labels {} layers of {} kv heads, but this slice is layer {} kv head {}: give "
                  "the pattern of this model.",
                  params_.pattern, labels_->alpha.size(), labels_->alpha[0].size(), layer, kv);
  }

  DuoParams params_;
  std::shared_ptr<const HeadLabels> labels_;
};

[[maybe_unused]] const bool kRegistered = register_estimator(Declaration<DuoParams>{
    .name = "duo",
    .family = "selection",
    .summary = "DuoAttention: retrieval heads read every key, streaming heads their sinks and recent keys, by a "
               "per-(layer, kv head) pattern",
    .page = "estimators/selection.md",
    .params = ParamSet<DuoParams>()
                  .integer("sink", &DuoParams::sink, 0, int64_t{1} << 30, "the first keys a streaming head keeps")
                  .integer("window", &DuoParams::window, 1, int64_t{1} << 30,
                           "the last keys up to the query's own a streaming head keeps (recent size + 1)")
                  .text("pattern", &DuoParams::pattern,
                        "a DuoAttention full_attention_heads.tsv (lines: layers; tab-separated: kv heads); empty: "
                        "every head streams")
                  .real("threshold", &DuoParams::threshold, 0, 1, "a pair with alpha >= threshold is a retrieval head")
                  .real("fraction", &DuoParams::fraction, -1, 1,
                        ">= 0: stream this fraction of all pairs, the lowest alpha first (kvpress); -1: threshold")
                  .integer("mix", &DuoParams::mix, 0, 1, "1: the training-time blend alpha*exact + (1-alpha)*streaming")
                  .check([](const DuoParams& p) {
                    require_usage(!p.mix || p.window >= 2,
                                  "duo: mix=1 blends with a streaming window of window - 1 keys; give window >= 2");
                  }),
    // Sinks and recent keys are positions: causal and window masks. Without a pattern this is streaming.
    .capabilities = {.random = false,
                     .forms = {Mask::kCausal, Mask::kWindow},
                     .decode = {Mask::kCausal, Mask::kWindow},
                     .weights = {Mask::kCausal, Mask::kWindow},
                     .selection = true,
                     .rounding = kKeptKeysRounded},
    .ablations = {"duo(sink=4,window=16)"},
    .make = [](const DuoParams& params) { return std::make_unique<Duo>(params); },
});

}  // namespace
}  // namespace attnprobe
