// CPU/GPU parity of the keyed generator: the device draws exactly the host's numbers (raw words
// bit for bit; normals within a few ulps of libm vs CUDA's sin/cos/log). Built with the CUDA
// backend; skipped, with the reason, when it is not built or no GPU is visible.
#include <cmath>

#include "attnprobe/rng/random_stream.h"
#include "support.h"

#ifdef ATTNPROBE_HAVE_CUDA
#include "attnprobe/gpu/device.h"
#endif

using namespace attnprobe;
using namespace attnprobe::test;

TEST_CASE("device Philox draws the host's numbers", "[gpu]") {
#ifndef ATTNPROBE_HAVE_CUDA
  SKIP_TEST("built without the CUDA backend (ATTNPROBE_CUDA=OFF or no nvcc)");
#else
  if (gpu::device_count() == 0) SKIP_TEST("no GPU visible: " + gpu::device_description());
  const uint64_t seed = 12345;
  INFO("seed " << seed);
  const RandomKey key = make_random_key(seed, "gpu-parity", 3);
  const RandomStream host(key, Purpose::kHashProjection);
  const int64_t count = 100003;
  for (int word = 0; word < 4; ++word) {
    const auto device = gpu::philox_words(key, Purpose::kHashProjection, 7, 11, word, count);
    int64_t mismatches = 0;
    for (int64_t i = 0; i < count; ++i) mismatches += device[i] != host.bits(static_cast<uint32_t>(i), 7, 11).v[word];
    CHECK(mismatches == 0);
  }
  const auto normals = gpu::normals(key, Purpose::kHashProjection, 5, 2, count);
  double worst = 0;
  for (int64_t i = 0; i < count; ++i) {
    const double h = host.normal(static_cast<uint32_t>(i), 5, 2);
    worst = std::max(worst, std::abs(normals[i] - h) / std::max(1.0, std::abs(h)));
  }
  // CUDA's double log/sin/cos are within 1-2 ulp of correctly rounded, like glibc's: a few 1e-16.
  CHECK(worst < 1e-14);
#endif
}

#ifdef ATTNPROBE_HAVE_CUDA
#include <fmt/format.h>

#include "attnprobe/estimators/registry.h"
#include "attnprobe/estimators/yoso/lsh.h"
#include "attnprobe/estimators/yoso/lsh_cuda.h"
#include "attnprobe/exact/exact_attention.h"
#include "attnprobe/gpu/kernels.h"

namespace {
// Awkward shapes: n not a multiple of any tile (and one that is), p not a power of two, p = 128
// at the kernels' limit.
struct Shape {
  int64_t n;
  int p;
};
const Shape kShapes[] = {{97, 50},    {97, 64},   {97, 128},  {1025, 50}, {1025, 64},
                         {1025, 128}, {4096, 50}, {4096, 64}, {4096, 128}};

HeadView parity_slice(const Shape& s) { return synth_slice(s.n, s.p, 0.3, 11); }

MatrixF run_on(const std::string& spec, const HeadView& view, Device device) {
  MatrixF out;
  make_estimator(parse_spec(spec), device)
      ->estimate(view, EstimateContext{make_random_key(12345, spec, 0), nullptr}, out);
  return out;
}

double error(const MatrixD& reference, const MatrixF& estimate) {
  return (reference - estimate.cast<double>()).norm() / reference.norm();
}

MatrixF exact_device(const HeadView& view, gpu::AttentionPrecision precision, bool causal) {
  MatrixF out(view.n(), view.pv());
  gpu::exact_attention(view.qf.data(), view.kf.data(), view.vf.data(), view.n(), view.n(), view.p(), view.pv(),
                       static_cast<float>(view.scale), precision, causal, out.data());
  return out;
}

// softmax over keys j ≤ i of each row, in float64 (n × pv).
MatrixD causal_attention_f64(const HeadView& view) {
  MatrixD out(view.n(), view.pv());
  for (int64_t i = 0; i < view.n(); ++i) {
    const Eigen::VectorXd logits = view.k.topRows(i + 1) * view.q.row(i).transpose() * view.scale;
    const Eigen::VectorXd weights = (logits.array() - logits.maxCoeff()).exp();
    out.row(i) = weights.transpose() * view.v.topRows(i + 1) / weights.sum();
  }
  return out;
}
}  // namespace
#endif

TEST_CASE("device hash codes are identical to the host's", "[gpu]") {
#ifndef ATTNPROBE_HAVE_CUDA
  SKIP_TEST("built without the CUDA backend (ATTNPROBE_CUDA=OFF or no nvcc)");
#else
  if (gpu::device_count() == 0) SKIP_TEST("no GPU visible: " + gpu::device_description());
  for (const Shape& shape : kShapes) {
    const HeadView view = parity_slice(shape);
    for (bool hadamard : {false, true}) {
      const RandomKey key = make_random_key(12345, "codes", hadamard);
      const auto host = lsh_codes(view.q, 32, 8, hadamard ? LshKind::kHadamard : LshKind::kGauss, key);
      std::vector<uint32_t> device(host.size());
      gpu::lsh_codes(view.q.data(), view.n(), view.p(), 32, 8, hadamard, key, device.data());
      int64_t mismatches = 0;
      for (size_t i = 0; i < host.size(); ++i) mismatches += host[i] != device[i];
      INFO("seed 12345, n " << shape.n << " p " << shape.p << (hadamard ? " hadamard" : " gauss"));
      CHECK(mismatches == 0);
    }
  }
#endif
}

TEST_CASE("device kernels match float64 where the comparison is exact", "[gpu]") {
#ifndef ATTNPROBE_HAVE_CUDA
  SKIP_TEST("built without the CUDA backend (ATTNPROBE_CUDA=OFF or no nvcc)");
#else
  if (gpu::device_count() == 0) SKIP_TEST("no GPU visible: " + gpu::device_description());
  for (const Shape& shape : kShapes) {
    const HeadView view = parity_slice(shape);
    INFO("seed 12345, n " << shape.n << " p " << shape.p);
    // Every precision of the exact kernels, plain and causal (the softmax estimator is tf32x3).
    const MatrixD reference = exact_attention_f64(view.q, view.k, view.v, view.scale);
    const double cpu_f32 = error(reference, run_on("softmax", view, Device::kCpu));
    for (bool causal : {false, true}) {
      // The causal reference: float64 on the host, each row's softmax over keys j ≤ i (n ≤ 1025
      // only; at 4096 the fp64 kernel, checked against it at the smaller sizes, stands in).
      MatrixD causal_ref;
      if (causal) {
        causal_ref = exact_device(view, gpu::AttentionPrecision::kFp64, true).cast<double>();
        if (view.n() <= 1025) {
          const MatrixD host = causal_attention_f64(view);
          INFO("causal fp64 kernel vs host float64: " << error(host, causal_ref.cast<float>()));
          CHECK(error(host, causal_ref.cast<float>()) < 1e-6);  // observed ≤ 4.9e-8 (H100, seed 12345)
          causal_ref = host;
        }
      }
      const MatrixD& ref = causal ? causal_ref : reference;
      const double fp64 = error(ref, exact_device(view, gpu::AttentionPrecision::kFp64, causal));
      const double tf32x3 = error(ref, exact_device(view, gpu::AttentionPrecision::kTf32x3, causal));
      const double tf32 = error(ref, exact_device(view, gpu::AttentionPrecision::kTf32, causal));
      INFO((causal ? "causal" : "full") << ": cpu f32 " << cpu_f32 << ", gpu fp64 " << fp64 << ", tf32x3 " << tf32x3
                                        << ", tf32 " << tf32);
      if (!causal) CHECK(fp64 < 1e-6);      // a reference in its own right; observed ≤ 5.0e-8
      CHECK(tf32x3 <= 2 * cpu_f32 + 1e-6);  // observed ≤ 1.01e-6 against bounds 1.29e-6..1.50e-6
      CHECK(tf32 < 1e-3);  // TF32 keeps 10 mantissa bits: observed ≤ 8.9e-5 here, 4.2e-4 on N(0,1) inputs
    }
    // yoso: identical codes, so the float64 evaluation of those codes is the reference.
    const std::string yoso = "yoso(m=16,tau=8,hash=gauss,norm=none)";
    const RandomKey key = make_random_key(12345, yoso, 0);
    const auto qc = lsh_codes(view.q, 16, 8, LshKind::kGauss, key), kc = lsh_codes(view.k, 16, 8, LshKind::kGauss, key);
    MatrixD exact_tables = MatrixD::Zero(view.n(), view.pv());
    for (int64_t i = 0; i < view.n(); ++i)
      for (int f = 0; f < 16; ++f)
        for (int64_t j = 0; j < view.n(); ++j)
          if (qc[i * 16 + f] == kc[j * 16 + f]) exact_tables.row(i) += view.v.row(j) / 16.0;
    const double cpu = error(exact_tables, run_on(yoso, view, Device::kCpu));
    const double gpu = error(exact_tables, run_on(yoso, view, Device::kCuda));
    INFO("yoso cpu " << cpu << " gpu " << gpu);
    CHECK(gpu <= 2 * cpu + 1e-6);
  }
#endif
}

#ifdef ATTNPROBE_HAVE_CUDA
namespace {
// Written from the definition (docs/specs.md, "Masks and query rows"), not from the kernel: row r at positions[r] sees
// keys [lo, hi) of the mask; its output is the float64 softmax-weighted mean of those values.
MatrixD decode_attention_f64(const MatrixD& q, const std::vector<int64_t>& positions, const MatrixD& k,
                             const MatrixD& v, double scale, gpu::KeyMask mask, int64_t window) {
  MatrixD out = MatrixD::Zero(q.rows(), v.cols());
  for (int64_t r = 0; r < q.rows(); ++r) {
    const int64_t t = positions[r], keys = k.rows();
    const int64_t hi = mask == gpu::KeyMask::kFull ? keys : std::min(t + 1, keys);
    const int64_t lo = mask == gpu::KeyMask::kWindow ? std::max<int64_t>(0, t - window + 1) : 0;
    const Eigen::VectorXd logits = k.middleRows(lo, hi - lo) * q.row(r).transpose() * scale;
    const Eigen::VectorXd weights = (logits.array() - logits.maxCoeff()).exp();
    out.row(r) = weights.transpose() * v.middleRows(lo, hi - lo) / weights.sum();
  }
  return out;
}
}  // namespace
#endif

TEST_CASE("device decode attention matches float64 at every geometry", "[gpu][decode]") {
#ifndef ATTNPROBE_HAVE_CUDA
  SKIP_TEST("built without the CUDA backend (ATTNPROBE_CUDA=OFF or no nvcc)");
#else
  if (gpu::device_count() == 0) SKIP_TEST("no GPU visible: " + gpu::device_description());
  struct Case {
    int64_t rows, keys;
    int p, pv;
    gpu::KeyMask mask;
    int64_t window;
    int64_t heads;   ///< rows are `heads` query heads of one kv group repeating the same positions
    int64_t stride;  ///< positions spaced by this much, ending at the last key (1: the last rows)
  };
  using gpu::KeyMask;
  const Case cases[] = {
      {1, 1, 8, 8, KeyMask::kCausal, 0, 1, 1},              // one key
      {1, 70001, 128, 128, KeyMask::kFull, 0, 1, 1},        // one row: the 4-row warps, many splits
      {3, 4099, 50, 40, KeyMask::kCausal, 0, 1, 1},         // head dims off the 32-column lanes, p ≠ pv
      {16, 100003, 128, 128, KeyMask::kCausal, 0, 1, 1},    // 16 decode steps over a long cache
      {16, 100003, 64, 64, KeyMask::kWindow, 1000, 1, 1},   // a window inside one split
      {16, 20000, 64, 64, KeyMask::kWindow, 1, 1, 1},       // window 1: each row sees its own key only
      {16, 9000, 100, 128, KeyMask::kWindow, 700, 1, 377},  // spaced positions, windows apart
      {64, 70001, 64, 64, KeyMask::kCausal, 0, 4, 1},       // GQA: 4 heads × 16 steps, K and V shared
      {37, 37, 64, 64, KeyMask::kCausal, 0, 1, 1},          // self-attention through the decode kernel
      {300, 300, 32, 32, KeyMask::kWindow, 100, 1, 1},      // a window form over a whole slice
  };
  for (const Case& c : cases) {
    const int64_t steps = c.rows / c.heads;
    std::vector<int64_t> positions(c.rows);
    for (int64_t h = 0; h < c.heads; ++h)
      for (int64_t i = 0; i < steps; ++i) positions[h * steps + i] = c.keys - 1 - (steps - 1 - i) * c.stride;
    const HeadView keys_view = synth_slice(c.keys, c.p, 0.3, 17, c.pv);
    const HeadView query_view = synth_slice(c.rows, c.p, 0.3, 23, c.pv);
    // The float32 inputs the kernel reads, in float64.
    const MatrixD reference = decode_attention_f64(query_view.qf.cast<double>(), positions, keys_view.kf.cast<double>(),
                                                   keys_view.vf.cast<double>(), keys_view.scale, c.mask, c.window);
    auto decode = [&](bool fp64_mode) {
      MatrixF out(c.rows, c.pv);
      gpu::decode_attention(query_view.qf.data(), positions.data(), keys_view.kf.data(), keys_view.vf.data(), c.rows,
                            c.keys, c.p, c.pv, static_cast<float>(keys_view.scale), c.mask, c.window, fp64_mode,
                            out.data());
      return out;
    };
    const double error64 = error(reference, decode(true));
    INFO("rows " << c.rows << " keys " << c.keys << " p " << c.p << " pv " << c.pv << " mask "
                 << static_cast<int>(c.mask) << " window " << c.window << ": fp64 " << error64);
    // fp64 sums the float32 inputs in double and rounds the output to float: observed 2.3e-8..2.6e-8 (H200).
    CHECK(error64 < 1e-7);
    // The float32 kernel with each of its row counts per warp (the default picks by rows) and, with 128 keys
    // a block, many more splits to merge.
    for (const auto& [per_warp, split_keys] : {std::pair{0, 0}, {4, 0}, {8, 0}, {16, 0}, {0, 128}}) {
      gpu::set_decode_tuning(per_warp, split_keys);
      const MatrixF fp32 = decode(false);
      gpu::set_decode_tuning(0, 0);
      const double error32 = error(reference, fp32);
      INFO(per_warp << " rows a warp, " << split_keys << " keys a block at least: fp32 " << error32);
      // float32 logits (scale·log2 e folded into q) and sums of at most a split's keys per lane: observed
      // 6.2e-8..9.8e-8 with the defaults (H200).
      CHECK(error32 < 1e-6);
      CHECK(fp32.allFinite());
    }
  }
#endif
}
