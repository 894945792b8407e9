#include "attnprobe/metrics/catalogue.h"

#include <fmt/format.h>

#include <algorithm>

#include "attnprobe/common/error.h"
#include "attnprobe/common/text.h"

namespace attnprobe {

const std::vector<Metric>& all_metrics() {
  static const std::vector<Metric> kAll = {Metric::kSpec,   Metric::kSpecRel, Metric::kFro,
                                           Metric::kFroRel, Metric::kMse,     Metric::kNmse,
                                           Metric::kMaxAbs, Metric::kAngle,   Metric::kZeroRows};
  return kAll;
}

const std::vector<Metric>& case_metrics() {
  static const std::vector<Metric> kCase = {Metric::kBiasFroRel, Metric::kVarFroRel, Metric::kBiasSpecRel};
  return kCase;
}

const std::vector<Metric>& weight_metrics() {
  static const std::vector<Metric> kWeights = {Metric::kRowTv, Metric::kRowKl, Metric::kTopkRecall};
  return kWeights;
}

const std::vector<Metric>& selection_metrics() {
  static const std::vector<Metric> kSelection = {
      Metric::kKeysAttended,   Metric::kKeysScored,  Metric::kDensity,       Metric::kDensityScored,
      Metric::kMassRecall,     Metric::kTailMass,    Metric::kTailGap,       Metric::kTailPred,
      Metric::kRowKlRev,       Metric::kKeptOverlap, Metric::kTopkRecallAtK, Metric::kDenRel,
      Metric::kNumRel,         Metric::kEpsCover,    Metric::kPilot,         Metric::kRepsAttended,
      Metric::kKeptOverlapF32, Metric::kScoreTies,   Metric::kCutTies,       Metric::kKeptOverlapA};  // later ones last
  return kSelection;
}

const std::vector<Metric>& precision_metrics() {
  static const std::vector<Metric> kPrecision = {
      Metric::kApproxErr,       Metric::kRoundFloor,    Metric::kRoundExcess,
      Metric::kFaRatio,         Metric::kApproxErrSpec, Metric::kRoundFloorSpec,
      Metric::kRoundExcessSpec, Metric::kFaRatioSpec,   Metric::kNonfiniteRows};
  return kPrecision;
}

bool is_precision_metric(Metric metric) {
  const auto& p = precision_metrics();
  return std::find(p.begin(), p.end(), metric) != p.end();
}

bool is_selection_metric(Metric metric) {
  const auto& s = selection_metrics();
  return std::find(s.begin(), s.end(), metric) != s.end();
}

bool is_weight_metric(Metric metric) {
  const auto& w = weight_metrics();
  return std::find(w.begin(), w.end(), metric) != w.end();
}

bool is_case_metric(Metric metric) {
  const auto& c = case_metrics();
  return std::find(c.begin(), c.end(), metric) != c.end();
}

const std::vector<Metric>& gradient_metrics() {
  static const std::vector<Metric> kGradient = {Metric::kGradQFroRel, Metric::kGradQAngle, Metric::kGradVFroRel,
                                                Metric::kGradPairs};
  return kGradient;
}

bool is_gradient_metric(Metric metric) {
  const auto& g = gradient_metrics();
  return std::find(g.begin(), g.end(), metric) != g.end();
}

const char* metric_name(Metric metric) {
  switch (metric) {
    case Metric::kRowTv:
      return "row_tv";
    case Metric::kRowKl:
      return "row_kl";
    case Metric::kTopkRecall:
      return "topk_recall";
    case Metric::kKeysAttended:
      return "keys_attended";
    case Metric::kKeysScored:
      return "keys_scored";
    case Metric::kRepsAttended:
      return "reps_attended";
    case Metric::kDensity:
      return "density";
    case Metric::kDensityScored:
      return "density_scored";
    case Metric::kMassRecall:
      return "mass_recall";
    case Metric::kTailMass:
      return "tail_mass";
    case Metric::kTailGap:
      return "tail_gap";
    case Metric::kTailPred:
      return "tail_pred";
    case Metric::kRowKlRev:
      return "row_kl_rev";
    case Metric::kKeptOverlap:
      return "kept_overlap";
    case Metric::kTopkRecallAtK:
      return "topk_recall@10";  // kDefaultRecallK
    case Metric::kDenRel:
      return "den_rel";
    case Metric::kNumRel:
      return "num_rel";
    case Metric::kEpsCover:
      return "eps_cover";
    case Metric::kPilot:
      return "pilot";
    case Metric::kBiasFroRel:
      return "bias_fro_rel";
    case Metric::kVarFroRel:
      return "var_fro_rel";
    case Metric::kBiasSpecRel:
      return "bias_spec_rel";
    case Metric::kSpec:
      return "spec";
    case Metric::kSpecRel:
      return "spec_rel";
    case Metric::kFro:
      return "fro";
    case Metric::kFroRel:
      return "fro_rel";
    case Metric::kMse:
      return "mse";
    case Metric::kNmse:
      return "nmse";
    case Metric::kMaxAbs:
      return "maxabs";
    case Metric::kAngle:
      return "angle";
    case Metric::kZeroRows:
      return "zero_rows";
    case Metric::kGradQFroRel:
      return "grad_q_fro_rel";
    case Metric::kGradQAngle:
      return "grad_q_angle";
    case Metric::kGradVFroRel:
      return "grad_v_fro_rel";
    case Metric::kGradPairs:
      return "grad_pairs";
    case Metric::kApproxErr:
      return "approx_err";
    case Metric::kRoundFloor:
      return "round_floor";
    case Metric::kRoundExcess:
      return "round_excess";
    case Metric::kFaRatio:
      return "fa_ratio";
    case Metric::kApproxErrSpec:
      return "approx_err_spec";
    case Metric::kRoundFloorSpec:
      return "round_floor_spec";
    case Metric::kRoundExcessSpec:
      return "round_excess_spec";
    case Metric::kFaRatioSpec:
      return "fa_ratio_spec";
    case Metric::kNonfiniteRows:
      return "nonfinite_rows";
    case Metric::kKeptOverlapF32:
      return "kept_overlap_f32";
    case Metric::kScoreTies:
      return "score_ties";
    case Metric::kCutTies:
      return "cut_ties";
    case Metric::kKeptOverlapA:
      return "kept_overlap_a";
  }
  return "?";
}

// Built once: find_metric runs for every row the CSV readers parse.
const std::vector<Metric>& known_metrics() {
  static const std::vector<Metric> kKnown = [] {
    std::vector<Metric> known = all_metrics();
    known.insert(known.end(), case_metrics().begin(), case_metrics().end());
    known.insert(known.end(), weight_metrics().begin(), weight_metrics().end());
    known.insert(known.end(), selection_metrics().begin(), selection_metrics().end());
    known.insert(known.end(), gradient_metrics().begin(), gradient_metrics().end());
    known.insert(known.end(), precision_metrics().begin(), precision_metrics().end());
    return known;
  }();
  return kKnown;
}

bool larger_is_better(Metric metric) {
  return metric == Metric::kTopkRecall || metric == Metric::kMassRecall || metric == Metric::kKeptOverlap ||
         metric == Metric::kTopkRecallAtK || metric == Metric::kEpsCover || metric == Metric::kKeptOverlapF32 ||
         metric == Metric::kKeptOverlapA;
}

std::string metric_name(Metric metric, int64_t recall_k) {
  return metric == Metric::kTopkRecallAtK ? fmt::format("topk_recall@{}", recall_k) : metric_name(metric);
}

namespace {
constexpr std::string_view kRecallPrefix = "topk_recall@";

// K of a name topk_recall@K (K a positive integer without sign or leading zeros), or 0 for any other name.
int64_t recall_k_of(std::string_view name) {
  if (!name.starts_with(kRecallPrefix)) return 0;
  const std::string_view digits = name.substr(kRecallPrefix.size());
  if (digits.empty() || digits.size() > 9 || digits[0] == '0') return 0;
  int64_t k = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return 0;
    k = 10 * k + (c - '0');
  }
  return k;
}
}  // namespace

std::optional<Metric> find_metric(std::string_view name) {
  if (recall_k_of(name)) return Metric::kTopkRecallAtK;
  for (Metric m : known_metrics())
    if (name == metric_name(m)) return m;
  return std::nullopt;
}

std::vector<Metric> parse_metrics(const std::string& text, int64_t* recall_k) {
  const std::vector<Metric>& known = known_metrics();
  std::vector<std::string> names;
  for (Metric m : known) names.push_back(metric_name(m));
  std::vector<Metric> out;
  auto add = [&](Metric m) {
    if (std::find(out.begin(), out.end(), m) == out.end()) out.push_back(m);
  };
  for (const std::string& raw : split(text, ',')) {
    const std::string name = trim(raw);
    if (name == "all" || name == "case" || name == "weights" || name == "selection" || name == "precision") {
      for (Metric m : name == "all"         ? all_metrics()
                      : name == "case"      ? case_metrics()
                      : name == "weights"   ? weight_metrics()
                      : name == "precision" ? precision_metrics()
                                            : selection_metrics())
        add(m);
      continue;
    }
    if (const int64_t k = recall_k_of(name)) {
      if (recall_k && *recall_k >= 0) {  // a negative K is the planner's error to report
        if (*recall_k == 0) *recall_k = k;
        if (*recall_k != k)
          throw UsageError(
              fmt::format("--metrics names {} but the sweep computes topk_recall@{} (--recall-k or an "
                          "earlier name): one K per sweep",
                          name, *recall_k));
      }
      add(Metric::kTopkRecallAtK);
      continue;
    }
    auto it = std::find(names.begin(), names.end(), name);
    if (it == names.end())
      throw UsageError(
          fmt::format("unknown metric '{}': use 'all' (per trial), 'case' (per case), 'weights' "
                      "(attention weights), 'selection' (the keys a selection reads), 'precision' (rounding vs "
                      "approximation), or a list of {}",
                      name, join(names, ",")));
    add(known[it - names.begin()]);
  }
  // The order rows are written in: plain per-trial metrics, precision ones, attention-weight ones, selection ones,
  // then per case.
  std::stable_sort(out.begin(), out.end(), [](Metric a, Metric b) {
    auto rank = [](Metric m) {
      return is_case_metric(m)        ? 4
             : is_selection_metric(m) ? 3
             : is_weight_metric(m)    ? 2
             : is_precision_metric(m) ? 1
                                      : 0;
    };
    return rank(a) < rank(b);
  });
  return out;
}

}  // namespace attnprobe
