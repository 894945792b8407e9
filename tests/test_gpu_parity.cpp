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
