#include "attnprobe/view/head_view.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "attnprobe/common/text.h"

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace attnprobe {

const char* mask_name(Mask mask) {
  switch (mask) {
    case Mask::kCausal:
      return "causal";
    case Mask::kWindow:
      return "window";
    case Mask::kFull:
      break;
  }
  return "full";
}

std::string mask_text(Mask mask, int64_t window) {
  return mask == Mask::kWindow ? fmt::format("window:{}", window) : std::string(mask_name(mask));
}

std::optional<MaskSpec> parse_mask(std::string_view text) {
  if (text == "full") return MaskSpec{Mask::kFull, 0};
  if (text == "causal") return MaskSpec{Mask::kCausal, 0};
  constexpr std::string_view kWindow = "window:";
  if (text.substr(0, kWindow.size()) == kWindow) {
    int64_t width = 0;
    if (parse_int(text.substr(kWindow.size()), width) && width >= 1) return MaskSpec{Mask::kWindow, width};
  }
  return std::nullopt;
}

std::string query_rows_text(QueryRows rows) {
  switch (rows.kind) {
    case QueryRows::Kind::kLast:
      return "last:" + std::to_string(rows.last) +
             (rows.prefill >= 0 ? ";prefill=" + std::to_string(rows.prefill) : "");
    case QueryRows::Kind::kDump:
      return "dump";
    case QueryRows::Kind::kAll:
      break;
  }
  return "all";
}

std::optional<QueryRows> parse_query_rows(std::string_view text) {
  if (text == "all") return QueryRows{};
  if (text == "dump") return QueryRows{QueryRows::Kind::kDump, 0};
  constexpr std::string_view kLast = "last:", kPrefill = ";prefill=";
  if (text.substr(0, kLast.size()) == kLast) {
    text.remove_prefix(kLast.size());
    const size_t cut = text.find(kPrefill);
    int64_t rows = 0, prefill = -1;
    if (cut != std::string_view::npos && !(parse_int(text.substr(cut + kPrefill.size()), prefill) && prefill >= 0))
      return std::nullopt;
    if (parse_int(text.substr(0, cut), rows) && rows >= 1) return QueryRows{QueryRows::Kind::kLast, rows, prefill};
  }
  return std::nullopt;
}

namespace {

// The float32 copy the estimators compute from, on 2 MiB pages where the system allows it. Estimators that
// read random rows (informer's sampled keys: ~70 per query) need a page walk for most of them once the
// matrix outgrows the TLB's reach (3072 entries × 4 KiB ≈ 12 MiB on Zen 4: K at n = 65536, p = 64 is 16 MiB;
// inferred from timings, these VMs expose no counters). On huge pages informer took 116 → 93 ms at
// n = 65536 and the same at 16384. The pages are asked for before the first write (the storage is untouched
// until the cast), only for the 2 MiB-aligned inside of the block, and only as advice: the kernel may
// decline, and no value changes.
MatrixF cast_on_huge_pages(const MatrixD& m) {
  MatrixF out(m.rows(), m.cols());
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHugePage = uintptr_t{2} << 20;
  const auto first = reinterpret_cast<uintptr_t>(out.data());
  const uintptr_t begin = (first + kHugePage - 1) & ~(kHugePage - 1);
  const uintptr_t end = (first + static_cast<uintptr_t>(out.size()) * sizeof(float)) & ~(kHugePage - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#endif
  out = m.cast<float>();
  return out;
}

}  // namespace

HeadView make_head_view(SliceId id, double scale, MatrixD q, MatrixD k, MatrixD v, Mask mask) {
  HeadView view;
  view.mask = mask;
  view.id = id;
  view.scale = scale;
  view.q = std::move(q);
  view.k = std::move(k);
  view.v = std::move(v);
  view.qf = cast_on_huge_pages(view.q);
  view.kf = cast_on_huge_pages(view.k);
  view.vf = cast_on_huge_pages(view.v);
  return view;
}

HeadView with_data(const HeadView& like, MatrixD q, MatrixD k, MatrixD v) {
  HeadView view = make_head_view(like.id, like.scale, std::move(q), std::move(k), std::move(v), like.mask);
  view.window = like.window;
  view.first_position = like.first_position;
  view.positions = like.positions;
  view.prompt_qf = like.prompt_qf;
  view.prefill = like.prefill;
  view.group = like.group;
  view.shaping = like.shaping;
  view.rope_inv_freq = like.rope_inv_freq;
  return view;
}

HeadView last_rows(const HeadView& whole, int64_t rows) {
  HeadView view;
  view.id = whole.id;
  view.scale = whole.scale;
  view.mask = whole.mask;
  view.window = whole.window;
  view.first_position = whole.first_position + whole.n() - rows;
  view.rope_inv_freq = whole.rope_inv_freq;
  view.q = whole.q.bottomRows(rows);
  view.shaping = whole.shaping.cut(whole.n() - rows, rows, whole.keys());
  view.qf = whole.qf.bottomRows(rows);
  // The prompt: whole's own prompt (when it is itself a cut of a self-attention slice) and its rows before these.
  if (whole.positions.empty() && whole.prompt_qf.rows() == whole.first_position) {
    view.prompt_qf.resize(view.first_position, whole.qf.cols());
    view.prompt_qf << whole.prompt_qf, whole.qf.topRows(whole.n() - rows);
  }
  if (whole.group) {  // the same cut of every member's rows
    auto group = std::make_shared<QueryGroup>();
    group->member = whole.group->member;
    group->keys = whole.group->keys;  // every key stays: the cut is of query rows
    group->rows.resize(whole.group->rows.size());
    group->prompt.resize(whole.group->rows.size());
    for (int m = 0; m < group->size(); ++m) {
      if (m == group->member) continue;
      const MatrixF& all = whole.group->rows[m];
      group->prompt[m].resize(view.prompt_qf.rows() > 0 ? view.first_position : 0, all.cols());
      if (group->prompt[m].rows() > 0) group->prompt[m] << whole.group->prompt[m], all.topRows(all.rows() - rows);
      group->rows[m] = all.bottomRows(rows);
    }
    view.group = std::move(group);
  }
  view.k = whole.k;
  view.kf = whole.kf;
  view.v = whole.v;
  view.vf = whole.vf;
  return view;
}

std::shared_ptr<const QueryGroup> prefix_group(const std::vector<const MatrixF*>& rows, int member, int64_t n,
                                               const std::vector<const MatrixF*>& keys) {
  auto group = std::make_shared<QueryGroup>();
  group->member = member;
  group->rows.resize(rows.size());
  group->prompt.resize(rows.size());
  for (size_t m = 0; m < rows.size(); ++m)
    if (static_cast<int>(m) != member) group->rows[m] = rows[m]->topRows(std::min<int64_t>(n, rows[m]->rows()));
  if (keys.empty()) return group;
  if (keys.size() != rows.size() || keys[member])
    throw std::logic_error("a group's keys must name every member, the view's own head reading the view's keys");
  std::map<const MatrixF*, std::shared_ptr<const MatrixF>> cut;  // one copy per kv head
  group->keys.resize(keys.size());
  for (size_t m = 0; m < keys.size(); ++m) {
    if (!keys[m]) continue;
    std::shared_ptr<const MatrixF>& shared = cut[keys[m]];
    if (!shared) shared = std::make_shared<const MatrixF>(keys[m]->topRows(std::min<int64_t>(n, keys[m]->rows())));
    group->keys[m] = shared;
  }
  return group;
}

std::string shaping_description(double softcap, bool alibi, bool bias) {
  std::vector<std::string> parts;
  if (softcap > 0) parts.push_back(fmt::format("a soft-cap of {:g}", softcap));
  if (alibi) parts.push_back("ALiBi");
  if (bias) parts.push_back("an additive bias");
  if (parts.empty()) return "nothing";
  std::string text = parts[0];
  for (size_t i = 1; i < parts.size(); ++i) text += (i + 1 == parts.size() ? " and " : ", ") + parts[i];
  return text;
}

std::string magnitude_problem(const MatrixD& q, const MatrixD& k, const MatrixD& v, double scale) {
  constexpr double kMaxRowNorm = 1e18, kMaxScore = 1e30;  // float32 holds 3.4e38
  auto norm_bound = [](const MatrixD& m) {
    return m.size() == 0 ? 0.0 : m.cwiseAbs().maxCoeff() * std::sqrt(static_cast<double>(m.cols()));
  };
  const double bq = norm_bound(q), bk = norm_bound(k), bv = norm_bound(v), score = scale * bq * bk;
  if (bq <= kMaxRowNorm && bk <= kMaxRowNorm && bv <= kMaxRowNorm && score <= kMaxScore) return "";
  return fmt::format(
      "values this large overflow (largest row norms: q {:.3g}, k {:.3g}, v {:.3g}; scale {:.3g}; scale·|q|·|k| "
      "{:.3g}, limits {:.0e} per row and {:.0e} per score)",
      bq, bk, bv, scale, score, kMaxRowNorm, kMaxScore);
}

std::string rotary_frequencies_problem(const std::vector<double>& inv_freq, int64_t p) {
  if (p % 2 != 0 || 2 * static_cast<int64_t>(inv_freq.size()) != p)
    return fmt::format("{} values for a head dim of {}: rotary frequencies pair channels, one per pair ({})",
                       inv_freq.size(), p, p % 2 != 0 ? "an odd head dim has none" : fmt::format("{}", p / 2));
  for (size_t f = 0; f < inv_freq.size(); ++f)
    if (!(std::isfinite(inv_freq[f]) && inv_freq[f] >= 0 && inv_freq[f] <= 1e6))
      return fmt::format("[{}] = {} is not an inverse frequency (finite, 0 to 1e6)", f, inv_freq[f]);
  return "";
}

}  // namespace attnprobe
