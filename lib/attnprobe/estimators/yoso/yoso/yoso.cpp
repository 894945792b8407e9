#include "attnprobe/estimators/yoso/yoso/yoso.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <unordered_map>

#include "attnprobe/common/error.h"
#include "attnprobe/estimators/registry.h"
#include "attnprobe/estimators/yoso/lsh.h"
#include "attnprobe/estimators/yoso/yoso_backward.h"
#include "attnprobe/exact/exact_attention.h"

namespace attnprobe {
namespace {

// Floats of bucket tables kept at once (2 MiB): a group of hashes' tables stays in L2.
constexpr int64_t kTableBudgetFloats = int64_t{1} << 19;

class YosoSampling final : public Estimator {
 public:
  explicit YosoSampling(YosoParams params)
      : m_(params.m),
        tau_(params.tau),
        kind_(params.hash),
        normalize_(params.normalize),
        lift_(params.lift),
        sparse_gradient_(params.sparse_gradient) {}

  void estimate(const HeadView& view, const EstimateContext& ctx, MatrixF& out) const override {
    const int64_t n = view.n(), keys = view.k.rows(), pv = view.pv();
    std::vector<uint32_t> query_codes, key_codes;
    hash_inputs(view, ctx.key, ctx.pool, nullptr, nullptr, query_codes, key_codes);
    // Y is summed in `out` itself: the caller's buffer, kept between calls (a fresh n × pv matrix per
    // call is 16 MiB at n = 65536, page-faulted anew each time). Zeroed where it is summed: by the
    // query blocks on the pool in the dense path (a serial memset of it and of the tables was 8% of a
    // two-thread call at n = 4096), at once otherwise.
    out.resize(n, pv);
    MatrixF& y = out;
    const int64_t buckets = int64_t{1} << tau_;
    if (buckets <= std::max<int64_t>(4096, 8 * keys)) {
      // Dense tables of 2^τ bucket sums for a group of hashes at once, sized to stay in cache:
      // one pass over the keys fills them, one pass over the queries reads them (streaming the
      // n × pv rows once per hash instead made n = 16384 3× slower).
      const int64_t table_floats = buckets * pv;
      const int group = static_cast<int>(std::clamp<int64_t>(kTableBudgetFloats / table_floats, 1, m_));
      // The calling thread's tables, kept between calls (2 MiB, page-faulted anew when fresh); a plain
      // reference, so the pool's threads below use these (a thread_local named in their lambdas would
      // be each worker's own, empty one).
      thread_local MatrixF kept_tables;
      MatrixF& tables = kept_tables;
      tables.resize(static_cast<int64_t>(group) * buckets, pv);
      for (int f0 = 0; f0 < m_; f0 += group) {
        const int g_count = std::min(group, m_ - f0);
        auto add_key = [&](int64_t j) {
          for (int g = 0; g < g_count; ++g) tables.row(g * buckets + key_codes[j * m_ + f0 + g]) += view.vf.row(j);
        };
        auto read_query = [&](int64_t i) {
          for (int g = 0; g < g_count; ++g) y.row(i) += tables.row(g * buckets + query_codes[i * m_ + f0 + g]);
        };
        if (view.mask == Mask::kCausal) {  // prefix bucket sums: query i reads the tables of keys 0..t_i
          tables.topRows(static_cast<int64_t>(g_count) * buckets).setZero();
          if (f0 == 0) y.setZero();
          int64_t next = 0;  // the tables hold keys 0..next − 1
          for (int64_t i = 0; i < n; ++i) {
            for (const int64_t seen = view.visible(i).end; next < seen; ++next) add_key(next);
            read_query(i);
          }
        } else {
          // Each hash's table is filled in key order by one thread (tables are disjoint), so the
          // sums do not depend on the thread count; queries only read the tables, so blocks of
          // rows run on the pool too. A thread fills the tables of 8 hashes at once, a block of
          // keys at a time: one pass over V per 8 hashes instead of one per hash (V is 16 MiB at
          // n = 65536, and streaming it m times made the fill superlinear in n).
          constexpr int kHashesPerPass = 8;
          constexpr int64_t kKeyBlock = 256;
          auto fill_tables = [&](int64_t part) {
            const int g_begin = static_cast<int>(part) * kHashesPerPass;
            const int g_end = std::min(g_count, g_begin + kHashesPerPass);
            tables.middleRows(g_begin * buckets, (g_end - g_begin) * buckets).setZero();
            for (int64_t j0 = 0; j0 < keys; j0 += kKeyBlock)
              for (int g = g_begin; g < g_end; ++g)
                for (int64_t j = j0; j < std::min(keys, j0 + kKeyBlock); ++j)
                  tables.row(g * buckets + key_codes[j * m_ + f0 + g]) += view.vf.row(j);
          };
          for_each_index(ctx.pool, (g_count + kHashesPerPass - 1) / kHashesPerPass, fill_tables);
          const int64_t block = 256, blocks = (n + block - 1) / block;
          auto read_block = [&](int64_t b) {
            const int64_t i0 = b * block, i1 = std::min(n, (b + 1) * block);
            if (f0 == 0) y.middleRows(i0, i1 - i0).setZero();
            for (int64_t i = i0; i < i1; ++i) read_query(i);
          };
          for_each_index(ctx.pool, blocks, read_block);
        }
      }
    } else if (view.mask == Mask::kCausal) {
      // Large τ, causal: per hash, the buckets met so far in a map (code → row of running sums).
      std::unordered_map<uint32_t, int64_t> slot;
      MatrixF sums(keys, pv);
      y.setZero();
      for (int f = 0; f < m_; ++f) {
        slot.clear();
        int64_t next = 0;  // the sums hold keys 0..next − 1
        for (int64_t i = 0; i < n; ++i) {
          for (const int64_t seen = view.visible(i).end; next < seen; ++next) {
            const auto [it, inserted] = slot.try_emplace(key_codes[next * m_ + f], static_cast<int64_t>(slot.size()));
            if (inserted) sums.row(it->second).setZero();
            sums.row(it->second) += view.vf.row(next);
          }
          if (const auto hit = slot.find(query_codes[i * m_ + f]); hit != slot.end()) y.row(i) += sums.row(hit->second);
        }
      }
    } else {
      // Large τ: sort the keys' codes and look each query up (no 2^τ memory).
      std::vector<int64_t> order(keys);
      std::vector<uint32_t> codes(keys);
      MatrixF sums(keys, pv);
      y.setZero();
      for (int f = 0; f < m_; ++f) {
        std::iota(order.begin(), order.end(), 0);
        std::sort(order.begin(), order.end(),
                  [&](int64_t a, int64_t b) { return key_codes[a * m_ + f] < key_codes[b * m_ + f]; });
        int64_t unique = 0;
        for (int64_t idx = 0; idx < keys; ++idx) {
          const uint32_t c = key_codes[order[idx] * m_ + f];
          if (unique == 0 || codes[unique - 1] != c) {
            codes[unique] = c;
            sums.row(unique).setZero();
            ++unique;
          }
          sums.row(unique - 1) += view.vf.row(order[idx]);
        }
        for (int64_t i = 0; i < n; ++i) {
          const uint32_t c = query_codes[i * m_ + f];
          auto it = std::lower_bound(codes.begin(), codes.begin() + unique, c);
          if (it != codes.begin() + unique && *it == c) y.row(i) += sums.row(it - codes.begin());
        }
      }
    }
    y /= static_cast<float>(m_);
    if (normalize_)
      for (int64_t i = 0; i < n; ++i) {
        const float norm = y.row(i).norm();
        if (norm > 0) y.row(i) /= norm;
      }
  }

  std::optional<Gradients> backward(const HeadView& view, const MatrixD& upstream,
                                    const EstimateContext& ctx) const override {
    MatrixD q_hat, k_hat;
    std::vector<uint32_t> query_codes, key_codes;
    hash_inputs(view, ctx.key, ctx.pool, &q_hat, &k_hat, query_codes, key_codes);
    if (sparse_gradient_)
      return yoso_sparse_gradient(query_codes, key_codes, m_, tau_, q_hat, k_hat, view.v, upstream, view.mask);
    return yoso_lsh_gradient(query_codes, key_codes, m_, tau_, k_hat, view.v, upstream, view.mask);
  }

  // Â_ij = (1/m)·#{f : h_f(q̂_i) = h_f(k̂_j)}, divided by ‖Y_i‖ with norm=l2 (so rows need not sum to one,
  // docs/metrics.md); a query that meets no key gets a zero row, as its estimate. The codes are those of
  // estimate() under the same key; per hash the keys are sorted by code once, and each query row reads its
  // bucket: O(n·m·log n) to set up, O(rows·(m·log n + collisions + keys·pv)) per block. Causal: the
  // collisions with keys j ≤ i only (what the causal form's prefix bucket sums hold), ‖Y_i‖ of its Y.
  WeightRows weights(const HeadView& view, const EstimateContext& ctx) const override {
    const int64_t keys = view.k.rows();
    std::vector<uint32_t> query_codes, key_codes;
    hash_inputs(view, ctx.key, ctx.pool, nullptr, nullptr, query_codes, key_codes);
    // Hash f's keys in code order: sorted_keys[f·keys + t], with their codes in sorted_codes.
    std::vector<int64_t> sorted_keys(static_cast<size_t>(m_) * keys);
    std::vector<uint32_t> sorted_codes(sorted_keys.size());
    for (int f = 0; f < m_; ++f) {
      const auto first = sorted_keys.begin() + static_cast<int64_t>(f) * keys;
      std::iota(first, first + keys, 0);
      std::stable_sort(first, first + keys,
                       [&](int64_t a, int64_t b) { return key_codes[a * m_ + f] < key_codes[b * m_ + f]; });
      for (int64_t t = 0; t < keys; ++t) sorted_codes[f * keys + t] = key_codes[first[t] * m_ + f];
    }
    return [&view, m = m_, keys, normalize = normalize_, query_codes = std::move(query_codes),
            sorted_keys = std::move(sorted_keys), sorted_codes = std::move(sorted_codes)](int64_t r0, int64_t rows) {
      MatrixD w = MatrixD::Zero(rows, keys);
      for (int64_t i = 0; i < rows; ++i)
        for (int f = 0; f < m; ++f) {
          const auto first = sorted_codes.begin() + static_cast<int64_t>(f) * keys;
          const auto [lo, hi] = std::equal_range(first, first + keys, query_codes[(r0 + i) * m + f]);
          for (auto it = lo; it != hi; ++it) w(i, sorted_keys[it - sorted_codes.begin()]) += 1.0;
        }
      for (int64_t i = 0; i < rows; ++i) w.row(i).tail(keys - view.visible(r0 + i).end).setZero();
      w /= static_cast<double>(m);
      if (normalize) {
        const VectorD norms = (w * view.v).rowwise().norm();
        for (int64_t i = 0; i < rows; ++i)
          if (norms(i) > 0) w.row(i) /= norms(i);
      }
      return w;
    };
  }

  // Projections for both sides (m·τ·p multiply-adds per row, or the FWHTs for hadamard, counted
  // as the gauss work) plus the table fill and read (m·pv adds per row each).
  double flops(int64_t n, int64_t p, int64_t pv) const override {
    return 2.0 * 2.0 * n * m_ * tau_ * p + 2.0 * n * m_ * pv;
  }

  // The codes of queries and keys (n·m uint32 each) and the bucket tables: dense 2^τ × pv tables
  // for a group of hashes (at least one whole table), or the sorted-codes path's n × pv sums.
  double memory_bytes(int64_t n, int64_t p, int64_t pv) const override {
    const double buckets = std::ldexp(1.0, tau_);
    const double tables =
        buckets <= std::max(4096.0, 8.0 * n) ? std::max(buckets * pv, double(kTableBudgetFloats)) : 2.0 * n * pv;
    return 2.0 * 4.0 * n * m_ + 4.0 * tables + 4.0 * 8.0 * n * (p + pv);
  }
  // backward(): the codes, q̂ and k̂ (p + 2 columns with input=lift), and the gradients; grad=lsh one hash's
  // occupied buckets × p′·pv tables (at most min(2^τ, n) buckets), grad=sparse the m sorted bucket lists.
  double backward_memory_bytes(int64_t n, int64_t p, int64_t pv) const override {
    const double dims = static_cast<double>(p + 2), rows = static_cast<double>(n);
    const double tables = sparse_gradient_ ? 16.0 * m_ * rows : 8.0 * std::min(std::ldexp(1.0, tau_), rows) * dims * pv;
    return 2.0 * 4.0 * rows * m_ + 8.0 * rows * (3.0 * dims + 2.0 * pv) + tables;
  }

 private:
  // The codes of q̂ and k̂. Codes of x and of ℓ2(x) are the same (a projection's sign ignores the
  // norm; a zero row projects to 0 either way), so with input=l2 the rows are hashed as they are
  // (as the CUDA version does); input=lift hashes the lifted rows. q_hat/k_hat, when given, receive
  // the inputs themselves (the backward pass needs them).
  void hash_inputs(const HeadView& view, RandomKey key, ThreadPool* pool, MatrixD* q_hat, MatrixD* k_hat,
                   std::vector<uint32_t>& query_codes, std::vector<uint32_t>& key_codes) const {
    MatrixD q, k;
    if (lift_ || q_hat) yoso_inputs(view.q, view.k, lift_, q, k);
    query_codes = lsh_codes(lift_ ? q : view.q, m_, tau_, kind_, key, pool);
    key_codes = lsh_codes(lift_ ? k : view.k, m_, tau_, kind_, key, pool);
    if (q_hat) *q_hat = std::move(q);
    if (k_hat) *k_hat = std::move(k);
  }

  int m_, tau_;
  LshKind kind_;
  bool normalize_, lift_, sparse_gradient_;
};

[[maybe_unused]] const bool kRegistered = register_estimator(Declaration<YosoParams>{
    .name = "yoso",
    .family = "yoso",
    .summary = "YOSO-m: m LSH hashes of tau bits; keys fill bucket sums, queries read them (O(n m (tau p + pv)))",
    .page = "estimators/yoso.md",
    .params =
        ParamSet<YosoParams>()
            .integer("m", &YosoParams::m, 1, 65536, "number of hashes (the samples knob)")
            .integer("tau", &YosoParams::tau, 1, 30, "hyperplane bits per hash (inverse temperature)")
            .choice("hash", &YosoParams::hash, {{"gauss", LshKind::kGauss}, {"hadamard", LshKind::kHadamard}},
                    "gauss: iid Gaussian hyperplanes (unbiased for yoso-e); hadamard: fast structured, biased")
            .choice("norm", &YosoParams::normalize, {{"l2", true}, {"none", false}}, "l2-normalise output rows, or not")
            .choice("input", &YosoParams::lift, {{"l2", false}, {"lift", true}},
                    "l2: hash q, k as they are (= their l2 rows); lift: hash unit rows in p+2 dims keeping the norms")
            .choice("grad", &YosoParams::sparse_gradient, {{"lsh", false}, {"sparse", true}},
                    "backward: the m-hash estimate of the lower bound (tables), or colliding pairs with exact weights"),
    .samples_knob = "m",
    .capabilities = {.random = true,
                     .forms = kFullAndCausal,
                     .decode = kFullAndCausal,
                     .weights = kFullAndCausal,
                     // The reference's CUDA kernels take float32 tensors only (hash tables and sums included), so a
                     // model in bf16 hashes and accumulates its upcast inputs: the inputs and output are its points.
                     .rounding = "inputs and output in the precision; the hash codes (signs of projections of the "
                                 "rounded inputs) and the hash-table sums float32, as YOSO's reference kernels take "
                                 "float32 tensors whatever the model's dtype",
                     .backward = Backward::kYoso,
                     .backward_forms = kFullAndCausal},
    // input=lift divides by the largest norm of the whole sequence: a later token changes row i, and any
    // other query row changes every row (no decode form).
    .narrow =
        [](const YosoParams& params, Capabilities& can) {
          if (params.lift) {
            can.forms = kFullOnly;
            can.decode = {};
          }
        },
    .target =
        [](const YosoParams& params) {
          return fmt::format("yoso-e(tau={},input={},grad=exact)", params.tau, params.lift ? "lift" : "l2");
        },
    // Identical hash codes; the tables' float atomics sum in another order: observed ≤ 1.1e-7 (H100, seed 12345).
    .devices = {{.device = Device::kCuda, .forms = kFullOnly, .tolerance = 1e-4}},
    .make = [](const YosoParams& params) { return std::make_unique<YosoSampling>(params); },
});

}  // namespace
}  // namespace attnprobe
