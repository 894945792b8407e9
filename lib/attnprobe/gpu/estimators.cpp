// The CUDA versions of the estimators, under the same names and specs as the CPU ones (the
// registry's Spec), drawing the same keyed random numbers: hash codes come from the same Philox
// streams on the device, random features are drawn on the host by the CPU's own function. Each
// call uploads the slice, runs the kernels of kernels.h and downloads the estimate.
// Estimators without a CUDA version here fail under --device cuda with a message naming these.
#include <cmath>
#include <functional>
#include <map>

#include "attnprobe/estimators/device.h"
#include "attnprobe/estimators/random_features/features.h"
#include "attnprobe/estimators/yoso/lsh.h"
#include "attnprobe/gpu/device.h"
#include "attnprobe/gpu/kernels.h"

namespace attnprobe::gpu {
namespace {

class CudaSoftmax final : public Estimator {
 public:
  void estimate(const HeadView& view, const EstimateContext&, MatrixF& out) const override {
    out.resize(view.n(), view.pv());
    // 3×TF32 on the tensor cores: fp32-level error (the parity test holds it to twice the CPU's),
    // where the simple fp32 kernel's sequential sums err 9× the CPU's at n = 4096 (PERF.md).
    exact_attention(view.qf.data(), view.kf.data(), view.vf.data(), view.n(), view.kf.rows(), view.p(), view.pv(),
                    static_cast<float>(view.scale), AttentionPrecision::kTf32x3, false, out.data());
  }
  double flops(int64_t n, int64_t p, int64_t pv) const override { return 2.0 * n * n * (p + pv); }
};

class CudaVMean final : public Estimator {
 public:
  void estimate(const HeadView& view, const EstimateContext&, MatrixF& out) const override {
    out.resize(view.n(), view.pv());
    vmean(view.vf.data(), view.n(), view.vf.rows(), view.pv(), out.data());
  }
};

class CudaYosoExpectation final : public Estimator {
 public:
  explicit CudaYosoExpectation(int tau) : tau_(tau) {}
  void estimate(const HeadView& view, const EstimateContext&, MatrixF& out) const override {
    const MatrixF q = normalize_rows(view.q).cast<float>(), k = normalize_rows(view.k).cast<float>();
    out.resize(view.n(), view.pv());
    yoso_expectation(q.data(), k.data(), view.vf.data(), view.n(), k.rows(), view.p(), view.pv(), tau_, out.data());
  }

 private:
  int tau_;
};

class CudaYoso final : public Estimator {
 public:
  CudaYoso(int m, int tau, bool hadamard, bool normalize)
      : m_(m), tau_(tau), hadamard_(hadamard), normalize_(normalize) {}
  void estimate(const HeadView& view, const EstimateContext& ctx, MatrixF& out) const override {
    std::vector<uint32_t> query_codes(view.n() * m_), key_codes(view.k.rows() * m_);
    lsh_codes(view.q.data(), view.n(), view.p(), m_, tau_, hadamard_, ctx.key, query_codes.data());
    lsh_codes(view.k.data(), view.k.rows(), view.p(), m_, tau_, hadamard_, ctx.key, key_codes.data());
    out.resize(view.n(), view.pv());
    yoso_tables(query_codes.data(), key_codes.data(), view.vf.data(), view.n(), view.k.rows(), view.pv(), m_, tau_,
                out.data());
    if (normalize_)
      for (int64_t i = 0; i < out.rows(); ++i) {
        const float norm = out.row(i).norm();
        if (norm > 0) out.row(i) /= norm;
      }
  }

 private:
  int m_, tau_;
  bool hadamard_, normalize_;
};

class CudaPerformer final : public Estimator {
 public:
  CudaPerformer(int64_t features, bool orthogonal) : features_(features), orthogonal_(orthogonal) {}
  void estimate(const HeadView& view, const EstimateContext& ctx, MatrixF& out) const override {
    const double root_scale = std::sqrt(view.scale);
    const MatrixD omegas = draw_omegas(features_, view.p(), orthogonal_, ctx.key);
    const MatrixD q = root_scale * view.q, k = root_scale * view.k;
    out.resize(view.n(), view.pv());
    performer(q.data(), k.data(), view.v.data(), omegas.data(), view.n(), k.rows(), view.p(), view.pv(), features_,
              out.data());
  }

 private:
  int64_t features_;
  bool orthogonal_;
};

const std::map<std::string, std::function<std::unique_ptr<Estimator>(const Spec&)>>& factories() {
  static const std::map<std::string, std::function<std::unique_ptr<Estimator>(const Spec&)>> kFactories = {
      {"softmax", [](const Spec&) { return std::make_unique<CudaSoftmax>(); }},
      {"vmean", [](const Spec&) { return std::make_unique<CudaVMean>(); }},
      {"yoso-e",
       [](const Spec& s) { return std::make_unique<CudaYosoExpectation>(static_cast<int>(s.get_int("tau"))); }},
      {"yoso",
       [](const Spec& s) {
         return std::make_unique<CudaYoso>(static_cast<int>(s.get_int("m")), static_cast<int>(s.get_int("tau")),
                                           s.get_choice("hash") == "hadamard", s.get_choice("norm") == "l2");
       }},
      {"performer",
       [](const Spec& s) { return std::make_unique<CudaPerformer>(s.get_int("M"), s.get_int("ortho") == 1); }},
  };
  return kFactories;
}

[[maybe_unused]] const bool kRegistered = register_cuda_backend(CudaBackend{
    .make = [](const Spec& spec) -> std::unique_ptr<Estimator> {
      auto it = factories().find(spec.name());
      return it == factories().end() ? nullptr : it->second(spec);
    },
    .names =
        [] {
          std::vector<std::string> names;
          for (const auto& [name, factory] : factories()) names.push_back(name);
          return names;
        },
    .device = []() -> std::string { return device_count() > 0 ? "" : device_description(); },
});

}  // namespace
}  // namespace attnprobe::gpu
