#include "attnprobe/estimators/selection/streaming/streaming.h"

#include <algorithm>

#include "attnprobe/common/error.h"
#include "attnprobe/estimators/registry.h"
#include "attnprobe/estimators/selection/kept_keys.h"

namespace attnprobe {
namespace {

class Streaming final : public KeptKeysEstimator {
 public:
  explicit Streaming(StreamingParams params) : params_(params) {}

  KeptRows kept_keys(const HeadView& view, const EstimateContext&) const override {
    if (params_.roll)
      return [&view, params = params_](int64_t i) {
        return KeptKeys{sink_and_window(view.visible(i), view.position(i), params.sink, params.window), {}};
      };
    const int64_t P = view.prompt_end();  // the first evaluated row, or earlier with --prefill
    require_usage(P > 0,
                  "streaming(roll=0) compresses the prompt before the first evaluated row, and this case has none: "
                  "measure decode rows with --queries last:W (W below the length).");
    return [&view, params = params_, P](int64_t i) {
      const KeyRange seen = view.visible(i);
      KeptKeys kept{{}, {}};
      append_range(kept.keys, seen.begin, std::min({params.sink, P, seen.end}));
      append_range(kept.keys, std::max({seen.begin, params.sink, P - params.window}), std::min(P, seen.end));
      append_range(kept.keys, std::max(P, seen.begin), seen.end);
      return kept;
    };
  }
  double flops(int64_t n, int64_t p, int64_t pv) const override {
    return 2.0 * n * static_cast<double>(std::min(n, params_.sink + params_.window)) * (p + pv);
  }

 private:
  StreamingParams params_;
};

[[maybe_unused]] const bool kRegistered = register_estimator(Declaration<StreamingParams>{
    .name = "streaming",
    .family = "selection",
    .summary = "StreamingLLM: each row attends the first `sink` keys and the last `window` keys (no scores)",
    .page = "estimators/selection.md",
    .params = ParamSet<StreamingParams>()
                  .integer("sink", &StreamingParams::sink, 0, int64_t{1} << 30, "the first keys, always kept")
                  .integer("window", &StreamingParams::window, 1, int64_t{1} << 30,
                           "the last keys up to the query's own (StreamingLLM's recent size + 1); roll=0: the "
                           "prompt's last keys kept")
                  .integer("roll", &StreamingParams::roll, 0, 1,
                           "1: a rolling cache, evicting every step; 0: the prompt compressed once (kvpress)"),
    .samples_knob = "window",
    // Positional: the full mask has no recency.
    .capabilities = {.random = false,
                     .forms = {Mask::kCausal, Mask::kWindow},
                     .decode = {Mask::kCausal, Mask::kWindow},
                     .weights = {Mask::kCausal, Mask::kWindow},
                     .selection = true,
                     .rounding = kKeptKeysRounded},
    .narrow =
        [](const StreamingParams& params, Capabilities& can) {
          if (params.roll) return;  // roll=0: decode rows after a prompt only (a position: no query rows needed)
          can.forms = {};
          can.decode = {Mask::kCausal};
          can.weights = {Mask::kCausal};
        },
    .ablations = {"streaming(sink=0,window=64)", "streaming(sink=2,window=16,roll=0)"},
    .make = [](const StreamingParams& params) { return std::make_unique<Streaming>(params); },
});

}  // namespace
}  // namespace attnprobe
