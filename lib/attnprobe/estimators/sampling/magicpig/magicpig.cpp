#include "attnprobe/estimators/sampling/magicpig/magicpig.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <memory>
#include <mutex>
#include <numbers>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "attnprobe/common/error.h"
#include "attnprobe/estimators/registry.h"
#include "attnprobe/estimators/selection/kept_keys.h"
#include "attnprobe/rng/random_matrix.h"

namespace attnprobe {

double simhash_collision(double cosine, int64_t K) {
  const double theta = std::acos(std::clamp(cosine, -1.0, 1.0));
  return std::pow(1.0 - theta / std::numbers::pi, static_cast<double>(K));
}

double magicpig_inclusion(double p, int64_t L, int64_t min) {
  if (min <= 0 || p >= 1) return min <= L ? 1.0 : 0.0;
  if (p <= 0 || min > L) return 0.0;
  const double n = static_cast<double>(L);
  if (min == 1) return -std::expm1(n * std::log1p(-p));
  // min = 2's closed form subtracts two logs of size (L − 1)·p from each other to leave ~C(L,2)·p²: relative error
  // ~1e-16/(L·p), so below L·p = 0.01 the series below (first term C(L,2)·p²·(1 − p)^{L−2}) takes over.
  if (min == 2 && n * p >= 0.01) return -std::expm1((n - 1) * std::log1p(-p) + std::log1p((n - 1) * p));
  // pmf(k + 1) = pmf(k)·(L − k)/(k + 1)·p/(1 − p), summed from the small side. pmf(k0) = C(L, k0)·p^k0·(1 − p)^{L−k0},
  // the coefficient as a product (a few ulps) while it stays finite, else through lgamma.
  const double odds = p / (1 - p);
  auto pmf = [&](int64_t k) {
    const double kk = static_cast<double>(k);
    double choose = 1;
    for (int64_t i = 1; i <= k && std::isfinite(choose); ++i) choose *= (n - kk + static_cast<double>(i)) / i;
    if (std::isfinite(choose) && choose < 1e300) return choose * std::pow(p, kk) * std::exp((n - kk) * std::log1p(-p));
    return std::exp(std::lgamma(n + 1) - std::lgamma(kk + 1) - std::lgamma(n - kk + 1) + kk * std::log(p) +
                    (n - kk) * std::log1p(-p));
  };
  if (n * p < static_cast<double>(min)) {  // the upper tail is the small side: past the mode its terms fall
    double term = pmf(min), sum = 0;
    for (int64_t k = min; k <= L && term > 0; ++k) {
      sum += term;
      if (term < 1e-18 * sum) break;
      term *= static_cast<double>(L - k) / static_cast<double>(k + 1) * odds;
    }
    return std::min(1.0, sum);
  }
  double term = pmf(0), lower = 0;
  for (int64_t k = 0; k < min; ++k) {
    lower += term;
    term *= static_cast<double>(L - k) / static_cast<double>(k + 1) * odds;
  }
  return std::max(0.0, 1.0 - lower);
}

namespace {

// What one call draws and hashes once (the header's regions, hyperplanes and key projections).
struct Tables {
  int64_t sink = 0, window = 0;  ///< the exact part's sizes (0 under the full mask)
  bool fixed = true;             ///< one hashed range H for every row (full mask, anchor=prefill)
  bool moving = false;           ///< anchor=row with center=1: a centre per row
  int64_t h0 = 0, h1 = 0;        ///< the keys whose codes are stored: [h0, h1)
  MatrixD keys;                  ///< keys × p, the float32 keys widened
  MatrixD planes_t;              ///< p × K·L, column l·K + b = g_{lK+b} (moving: column b·L + l)
  /// Moving: g·k_j by bit, then key, then table: g_{lK+b}·k_j at (b·keys + j)·L + l, so that the keys' projections
  /// of one bit lie in key order, read as one stream per bit while select_moving_rows goes through the keys.
  std::vector<double> key_proj;
  MatrixD prefix;               ///< (keys + 1) × p: Σ_{i<j} k_i in index order (moving: the centre of any H_t)
  RowVectorD centre;            ///< c of the stored codes (0 when center=0)
  std::vector<uint32_t> codes;  ///< (h1 − h0) × L codes of x_j = k_j − c (not moving)
  /// Not moving: per table, the stored keys as code·2³² + (j − h0), ascending, so a row finds the keys that share
  /// its code in a table by binary search instead of comparing every key's code (what a bucket gives MagicPIG).
  std::vector<std::vector<uint64_t>> buckets;
  /// Moving: each row's keys of H_t that collide at least `min` times, ascending, found for a block of
  /// kRowsAtOnce rows the first time one of them is asked for (rows are asked for from several threads).
  mutable std::vector<std::vector<int64_t>> selected;
  std::unique_ptr<std::once_flag[]> block_found;
};

// Moving rows searched together (select_moving_rows): a key's projections are read from memory once for the block,
// and most of its bits are decided for all of the block's rows at once. 32: attend_kept's task of rows on the thread
// pool (kept_keys.cpp), so that two threads do not wait for each other's block; 64 is 12% faster at n = 4096 but
// slower at 1024.
constexpr int64_t kRowsAtOnce = 32;

// H_t = [begin, end) within the keys row i sees (E_t is the rest), and the centre c of its keys.
struct HashedRange {
  int64_t begin = 0, end = 0;
  RowVectorD centre;
};

HashedRange hashed_range(const HeadView& view, const Tables& t, int64_t i) {
  const KeyRange seen = view.visible(i);
  HashedRange h{t.h0, t.h1, t.centre};
  if (!t.fixed) h.begin = t.sink, h.end = view.position(i) - t.window + 1;
  h.begin = std::clamp(h.begin, seen.begin, seen.end);
  h.end = std::clamp(h.end, h.begin, seen.end);
  if (t.moving && h.end > h.begin)
    h.centre = (t.prefix.row(h.end) - t.prefix.row(h.begin)) / static_cast<double>(h.end - h.begin);
  return h;
}

// Every projection g_f·x (f < K·L) at once, from the hyperplanes transposed (p × K·L): the loop runs across f in
// vector lanes, each sum adding its p terms in index order. Centres and queries go through it and keys through
// project_rows, which makes the same sums in the same order, so that equal vectors project equally (a lone hashed key
// minus its own centre is 0 in every bit of its code).
void project_all(const double* x, const MatrixD& planes_t, double* projections) {
  const int64_t p = planes_t.rows(), bits = planes_t.cols();
  std::fill(projections, projections + bits, 0.0);
  for (int64_t d = 0; d < p; ++d) {
    const double xd = x[d];
    const double* g = planes_t.row(d).data();
    for (int64_t f = 0; f < bits; ++f) projections[f] += xd * g[f];
  }
}

// project_all of rows x_0..x_{count−1} (row r at x + r·p) into out + r·K·L, with the same sum in the same order for
// every projection (so the same bits), four rows at a time over tiles of 128 planes: each plane's p values are read
// once for four rows, and the four rows' partial sums of a tile stay in the L1 cache (1.5× faster than one row at a
// time for 1500 planes of 64 channels).
void project_rows(const double* x, int64_t count, const MatrixD& planes_t, double* out) {
  constexpr int64_t kRows = 4, kTile = 128;
  const int64_t p = planes_t.rows(), bits = planes_t.cols();
  int64_t r0 = 0;
  for (; r0 + kRows <= count; r0 += kRows)
    for (int64_t f0 = 0; f0 < bits; f0 += kTile) {
      const int64_t width = std::min(kTile, bits - f0);
      double sums[kRows][kTile] = {};
      for (int64_t d = 0; d < p; ++d) {
        const double* g = planes_t.row(d).data() + f0;
        for (int64_t r = 0; r < kRows; ++r) {
          const double xd = x[(r0 + r) * p + d];
          for (int64_t f = 0; f < width; ++f) sums[r][f] += xd * g[f];
        }
      }
      for (int64_t r = 0; r < kRows; ++r) std::copy_n(sums[r], width, out + (r0 + r) * bits + f0);
    }
  for (; r0 < count; ++r0) project_all(x + r0 * p, planes_t, out + r0 * bits);
}

// The L codes of projections: bit b of code l is g_{lK+b}·x > 0.
void codes_of(const double* projections, int64_t K, int64_t L, uint32_t* codes) {
  for (int64_t l = 0; l < L; ++l) {
    uint32_t code = 0;
    for (int64_t b = 0; b < K; ++b) code |= static_cast<uint32_t>(projections[l * K + b] > 0) << b;
    codes[l] = code;
  }
}

// Bit l of `positive` (64 to a word): key[l] − centre[l] > 0, for l < L; 8 compares at a time.
void positive_bits(const double* key, const double* centre, int64_t L, uint64_t* positive) {
  std::fill(positive, positive + (L + 63) / 64, 0);
  int64_t l = 0;
#if defined(__AVX512F__)
  for (; l < L; l += 8) {
    const __mmask8 lanes = L - l >= 8 ? 0xFF : static_cast<__mmask8>((1u << (L - l)) - 1);
    const __m512d above =
        _mm512_sub_pd(_mm512_maskz_loadu_pd(lanes, key + l), _mm512_maskz_loadu_pd(lanes, centre + l));
    positive[l / 64] |= static_cast<uint64_t>(_mm512_mask_cmp_pd_mask(lanes, above, _mm512_setzero_pd(), _CMP_GT_OQ))
                        << (l % 64);
  }
#endif
  for (; l < L; ++l) positive[l / 64] |= static_cast<uint64_t>(key[l] - centre[l] > 0) << (l % 64);
}

// Moving: the selected keys of rows [i0, i1) into t.selected, by the bits' agreement table by table, not by codes.
// - The planes are in bit-major order (column b·L + l is g_{lK+b}): bit b of every table is one run of L projections,
//   compared at once. A table stays alive while each of its bits g·k_j − g·c > 0 agrees with the query's g·q > 0; a
//   key stops being compared once fewer than `min` tables are alive (after ~log₂ L of the K bits for most keys). The
//   tables alive after all K bits are its collisions.
// - Rows next to each other have nearly the same centre: a key's bit is decided for all the block's rows at once
//   where g·k_j lies above the largest g·c of the block or not above the smallest (g·k − g·c > 0 exactly when
//   g·k > g·c in IEEE arithmetic, so these bounds decide what each row's comparison would); only the few bits
//   between are compared row by row.
// The same comparisons as forming each code, made until they decide.
void select_moving_rows(const HeadView& view, const Tables& t, const MagicpigParams& o, int64_t i0, int64_t i1) {
  const int64_t K = o.K, L = o.L, bits = K * L, rows = i1 - i0;
  const int64_t words = (L + 63) / 64;  // a bit per table
  std::vector<HashedRange> ranges(rows);
  MatrixD centre_proj(rows, bits);  // g·c per row, so that g·x_j = g·k_j − g·c
  RowVectorD lowest = RowVectorD::Constant(bits, std::numeric_limits<double>::infinity());
  RowVectorD highest = RowVectorD::Constant(bits, -std::numeric_limits<double>::infinity());
  std::vector<uint64_t> query_bits(static_cast<size_t>(rows * K * words), 0);  // [row][b][table bit]
  std::vector<double> projections(bits);
  const std::vector<double> zero(L, 0.0);  // the query's bits are its projections' signs: g·q − 0 > 0
  int64_t first = std::numeric_limits<int64_t>::max(), last = 0;
  for (int64_t r = 0; r < rows; ++r) {
    ranges[r] = hashed_range(view, t, i0 + r);
    if (ranges[r].end <= ranges[r].begin) continue;
    first = std::min(first, ranges[r].begin), last = std::max(last, ranges[r].end);
    project_all(ranges[r].centre.data(), t.planes_t, centre_proj.row(r).data());
    lowest = lowest.cwiseMin(centre_proj.row(r));
    highest = highest.cwiseMax(centre_proj.row(r));
    const RowVectorD q = view.qf.row(i0 + r).cast<double>();
    project_all(q.data(), t.planes_t, projections.data());
    for (int64_t b = 0; b < K; ++b)
      positive_bits(projections.data() + b * L, zero.data(), L, &query_bits[(r * K + b) * words]);
  }
  // Per key, bit b of table l: positive for every row of the block (above the highest centre), and unsure (above the
  // lowest but not the highest), found level by level as the rows need them.
  std::vector<uint64_t> all_positive(static_cast<size_t>(K * words)), unsure(static_cast<size_t>(K * words));
  std::vector<uint64_t> all_alive(words, 0), alive(words);
  for (int64_t l = 0; l < L; ++l) all_alive[l / 64] |= uint64_t{1} << (l % 64);
  const int64_t n_keys = view.keys();
  for (int64_t j = first; j < last; ++j) {
    const auto key_bits = [&](int64_t b) { return &t.key_proj[static_cast<size_t>((b * n_keys + j) * L)]; };
    int64_t levels_known = 0;
    for (int64_t r = 0; r < rows; ++r) {
      if (j < ranges[r].begin || j >= ranges[r].end) continue;
      const double* centre = centre_proj.row(r).data();
      alive = all_alive;
      int64_t count = L;
      for (int64_t b = 0; b < K && count >= o.min; ++b) {
        uint64_t* positive = &all_positive[b * words];
        uint64_t* between = &unsure[b * words];
        if (b == levels_known) {
          const double* key = key_bits(b);
          positive_bits(key, highest.data() + b * L, L, positive);
          positive_bits(key, lowest.data() + b * L, L, between);
          for (int64_t w = 0; w < words; ++w) between[w] &= ~positive[w];
          ++levels_known;
        }
        const uint64_t* query = &query_bits[(r * K + b) * words];
        count = 0;
        for (int64_t w = 0; w < words; ++w) {
          uint64_t row_positive = positive[w];
          for (uint64_t left = between[w] & alive[w]; left != 0; left &= left - 1) {
            const int64_t l = 64 * w + std::countr_zero(left);
            row_positive |= static_cast<uint64_t>(key_bits(b)[l] - centre[b * L + l] > 0) << l % 64;
          }
          alive[w] &= ~(row_positive ^ query[w]);  // bits past L: alive's are 0 already
          count += std::popcount(alive[w]);
        }
      }
      if (count >= o.min) t.selected[i0 + r].push_back(j);
    }
  }
}

KeptKeys row_keys(const HeadView& view, const Tables& t, const MagicpigParams& o, int64_t i) {
  const KeyRange seen = view.visible(i);
  const int64_t p = view.p(), L = o.L, K = o.K;
  const HashedRange hashed = hashed_range(view, t, i);
  const int64_t hb = hashed.begin, he = hashed.end;
  const RowVectorD& centre = hashed.centre;
  const RowVectorD q = view.qf.row(i).cast<double>();
  KeptKeys kept{{}, {}, 0.0};  // keys_scored: table lookups, no scores
  append_range(kept.keys, seen.begin, hb);
  kept.log_weights.assign(kept.keys.size(), 0.0);
  // The keys of [hb, he) that collide with the query in at least `min` tables, ascending.
  std::vector<int64_t> selected;
  if (t.moving) {
    const int64_t block = i / kRowsAtOnce;
    std::call_once(t.block_found[block], [&] {
      select_moving_rows(view, t, o, block * kRowsAtOnce, std::min(view.n(), (block + 1) * kRowsAtOnce));
    });
    selected = t.selected[i];
  } else if (he > hb) {
    std::vector<double> projections(static_cast<size_t>(K * L));
    std::vector<uint32_t> query_codes(L);
    project_all(q.data(), t.planes_t, projections.data());
    codes_of(projections.data(), K, L, query_codes.data());
    std::vector<int32_t> collisions(static_cast<size_t>(t.h1 - t.h0), 0);
    for (int64_t l = 0; l < L; ++l) {
      const auto& bucket = t.buckets[l];
      const uint64_t code = static_cast<uint64_t>(query_codes[l]) << 32;
      for (auto it = std::lower_bound(bucket.begin(), bucket.end(), code);
           it != bucket.end() && (*it >> 32) == code >> 32; ++it) {
        const int64_t j = t.h0 + static_cast<int64_t>(*it & 0xffffffffu);
        if (++collisions[j - t.h0] == o.min && j >= hb && j < he) selected.push_back(j);
      }
    }
    std::sort(selected.begin(), selected.end());
  }
  const double q_norm = q.norm();
  RowVectorD x(p);
  for (const int64_t j : selected) {
    x = t.keys.row(j) - centre;
    const double norms = q_norm * x.norm();
    const double pi = magicpig_inclusion(simhash_collision(norms > 0 ? q.dot(x) / norms : 0.0, K), L, o.min);
    kept.keys.push_back(j);
    // π = 0 is a key no hyperplane set can select (opposite to q); the clamp keeps its weight finite.
    kept.log_weights.push_back(-std::log(std::max(pi + o.floor, std::numeric_limits<double>::min())));
  }
  append_range(kept.keys, he, seen.end);
  kept.log_weights.resize(kept.keys.size(), 0.0);
  return kept;
}

class Magicpig final : public KeptKeysEstimator {
 public:
  explicit Magicpig(MagicpigParams params) : o_(params) {}

  KeptRows kept_keys(const HeadView& view, const EstimateContext& ctx) const override {
    auto tables = std::make_shared<Tables>();
    Tables& t = *tables;
    const int64_t n_keys = view.keys(), p = view.p(), bits = o_.K * o_.L;
    t.keys = view.kf.cast<double>();
    t.planes_t = normal_rows(RandomStream(o_.tables == MagicpigTables::kGroup ? ctx.shared_key() : ctx.key,
                                          Purpose::kHashProjection),
                             bits, p)
                     .transpose();
    if (view.mask == Mask::kFull) {  // no positions: every key hashed, c the mean of all of them
      t.h0 = 0, t.h1 = n_keys;
    } else {
      t.sink = o_.sink, t.window = o_.window;
      const int64_t first = view.prompt_end();  // P: the first evaluated row, or earlier with --prefill
      t.fixed = o_.anchor == MagicpigAnchor::kPrefill || (o_.anchor == MagicpigAnchor::kAuto && first > 0);
      require_usage(
          !t.fixed || first > 0,
          "magicpig(anchor=prefill) hashes the prompt's keys, but the evaluated rows start at position 0 (no prompt): "
          "measure decode rows after a prompt with --queries last:W (W below the length), or use anchor=row");
      if (t.fixed) {
        t.h0 = std::min(o_.sink, first);
        t.h1 = std::max(t.h0, first - o_.window + 1);
      } else {  // anchor=row: each row reads its own range of the keys' codes
        t.moving = o_.center != 0;
        t.h0 = 0, t.h1 = n_keys;
      }
    }
    t.centre = RowVectorD::Zero(p);
    if (t.moving) {  // the planes in bit-major order for select_moving_rows: the same planes, the same sums
      MatrixD by_bit(p, bits);
      for (int64_t l = 0; l < o_.L; ++l)
        for (int64_t b = 0; b < o_.K; ++b) by_bit.col(b * o_.L + l) = t.planes_t.col(l * o_.K + b);
      t.planes_t = std::move(by_bit);
      t.prefix = MatrixD::Zero(n_keys + 1, p);
      for (int64_t j = 0; j < n_keys; ++j) t.prefix.row(j + 1) = t.prefix.row(j) + t.keys.row(j);
      t.key_proj.resize(static_cast<size_t>(n_keys * bits));
      constexpr int64_t kKeysAtOnce = 64;
      MatrixD projections(kKeysAtOnce, bits);
      for (int64_t j0 = 0; j0 < n_keys; j0 += kKeysAtOnce) {
        const int64_t count = std::min(kKeysAtOnce, n_keys - j0);
        project_rows(t.keys.row(j0).data(), count, t.planes_t, projections.data());
        for (int64_t r = 0; r < count; ++r)
          for (int64_t b = 0; b < o_.K; ++b)
            std::copy_n(projections.row(r).data() + b * o_.L, o_.L, &t.key_proj[((b * n_keys + j0 + r) * o_.L)]);
      }
      t.selected.resize(view.n());
      t.block_found = std::make_unique<std::once_flag[]>((view.n() + kRowsAtOnce - 1) / kRowsAtOnce);
      return [&view, tables, o = o_](int64_t i) { return row_keys(view, *tables, o, i); };
    }
    if (o_.center != 0 && t.h1 > t.h0) {
      for (int64_t j = t.h0; j < t.h1; ++j) t.centre += t.keys.row(j);
      t.centre /= static_cast<double>(t.h1 - t.h0);
    }
    t.codes.resize(static_cast<size_t>(t.h1 - t.h0) * o_.L);
    // The centred keys x_j = k_j − c, a block at a time, projected together.
    constexpr int64_t kKeysAtOnce = 64;
    MatrixD x(kKeysAtOnce, p), projections(kKeysAtOnce, bits);
    for (int64_t j0 = t.h0; j0 < t.h1; j0 += kKeysAtOnce) {
      const int64_t count = std::min(kKeysAtOnce, t.h1 - j0);
      for (int64_t r = 0; r < count; ++r) x.row(r) = t.keys.row(j0 + r) - t.centre;
      project_rows(x.data(), count, t.planes_t, projections.data());
      for (int64_t r = 0; r < count; ++r)
        codes_of(projections.row(r).data(), o_.K, o_.L, &t.codes[(j0 + r - t.h0) * o_.L]);
    }
    t.buckets.assign(o_.L, std::vector<uint64_t>(static_cast<size_t>(t.h1 - t.h0)));
    std::vector<int64_t> offsets;
    for (int64_t l = 0; l < o_.L; ++l) {
      auto& bucket = t.buckets[l];
      const auto packed = [&](int64_t j) {
        return static_cast<uint64_t>(t.codes[(j - t.h0) * o_.L + l]) << 32 | static_cast<uint64_t>(j - t.h0);
      };
      if (o_.K <= 16) {  // a counting sort over the 2^K codes: linear, stable, so keys ascend within a code
        offsets.assign((size_t{1} << o_.K) + 1, 0);
        for (int64_t j = t.h0; j < t.h1; ++j) ++offsets[t.codes[(j - t.h0) * o_.L + l] + 1];
        for (size_t c = 1; c < offsets.size(); ++c) offsets[c] += offsets[c - 1];
        for (int64_t j = t.h0; j < t.h1; ++j) bucket[offsets[t.codes[(j - t.h0) * o_.L + l]]++] = packed(j);
      } else {
        for (int64_t j = t.h0; j < t.h1; ++j) bucket[j - t.h0] = packed(j);
        std::sort(bucket.begin(), bucket.end());
      }
    }
    return [&view, tables, o = o_](int64_t i) { return row_keys(view, *tables, o, i); };
  }

  // Hashing the keys and each query, the code comparisons, then the exact part and ~2% sampled keys.
  double flops(int64_t n, int64_t p, int64_t pv) const override {
    const double bits = static_cast<double>(o_.K * o_.L), rows = static_cast<double>(n);
    const double kept = static_cast<double>(std::min(n, o_.sink + o_.window)) + 0.02 * rows;
    return 2.0 * bits * p * 2.0 * rows + static_cast<double>(o_.L) * rows * rows + 2.0 * rows * kept * (p + pv);
  }
  // The widened keys, their prefix sums and projections (anchor=row) or codes, and the hyperplanes.
  double memory_bytes(int64_t n, int64_t p, int64_t pv) const override {
    const double keys = static_cast<double>(n), bits = static_cast<double>(o_.K * o_.L);
    return Estimator::memory_bytes(n, p, pv) + 8.0 * keys * (2.0 * p + bits) + 4.0 * keys * o_.L + 8.0 * bits * p;
  }

 private:
  MagicpigParams o_;
};

[[maybe_unused]] const bool kRegistered = register_estimator(Declaration<MagicpigParams>{
    .name = "magicpig",
    .family = "sampling",
    .summary = "MagicPIG: sink and window exact, the rest sampled by SimHash collisions (K bits, L tables) with "
               "importance weights 1/(pi + floor)",
    .page = "estimators/sampling_decode.md",
    .params =
        ParamSet<MagicpigParams>()
            .integer("K", &MagicpigParams::K, 1, 30, "bits per hash table")
            .integer("L", &MagicpigParams::L, 1, int64_t{1} << 16, "hash tables")
            .integer("sink", &MagicpigParams::sink, 0, int64_t{1} << 30, "the first keys, exact (causal mask)")
            .integer("window", &MagicpigParams::window, 0, int64_t{1} << 30,
                     "the last keys up to the query's own, exact (causal mask; the reference's 64 local + 1)")
            .integer("min", &MagicpigParams::min, 1, int64_t{1} << 16,
                     "collisions that select a key (2: the reference; 1: the sparse-attention-hub's)")
            .real("floor", &MagicpigParams::floor, 0, 1,
                  "added to the inclusion probability in the weight (1e-4: the reference; 0: unbiased N and D)")
            .choice(
                "anchor", &MagicpigParams::anchor,
                {{"auto", MagicpigAnchor::kAuto}, {"prefill", MagicpigAnchor::kPrefill}, {"row", MagicpigAnchor::kRow}},
                "hashed keys: prefill (the prompt's, fixed; needs --queries last:W), row (each row's past), "
                "auto (prefill after a prompt, else row)")
            .integer("center", &MagicpigParams::center, 0, 1, "centre the hashed keys on their mean (1: reference)")
            .choice("tables", &MagicpigParams::tables,
                    {{"group", MagicpigTables::kGroup}, {"head", MagicpigTables::kHead}},
                    "hyperplanes per kv group (shared by its query heads, the reference) or per query head")
            .check([](const MagicpigParams& o) {
              require_usage(o.min <= o.L,
                            "magicpig: min={} exceeds L={}; no key can collide in more tables than there are", o.min,
                            o.L);
            }),
    .samples_knob = "L",
    .capabilities = {.random = true,
                     .forms = kFullAndCausal,
                     .decode = kFullAndCausal,
                     .weights = kFullAndCausal,
                     .selection = true,
                     .anchored = true,  // the default, anchor=auto, after a prompt
                     .rounding = kKeptKeysRounded},
    // anchor=prefill hashes the prompt's keys: decode rows after a prompt only; anchor=auto's decode rows are
    // anchored there while its whole slices hash each row's past.
    .narrow =
        [](const MagicpigParams& o, Capabilities& can) {
          if (o.anchor == MagicpigAnchor::kPrefill) {  // decode rows only (a whole slice has no prompt)
            can.prompt = true;
            can.forms = {};
          }
          can.anchored = o.anchor != MagicpigAnchor::kRow;
        },
    .ablations = {"magicpig(K=4,L=20,sink=2,window=9,min=1,floor=0,anchor=row)",
                  "magicpig(K=6,L=40,sink=4,window=17,min=3,floor=0)"},
    .make = [](const MagicpigParams& params) { return std::make_unique<Magicpig>(params); },
});

}  // namespace
}  // namespace attnprobe
