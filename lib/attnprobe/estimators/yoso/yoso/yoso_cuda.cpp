// The CUDA version of `yoso` (yoso.cpp): the hash codes come from the same Philox counters on the device
// (lsh.cu), so they are the CPU's. The backward pass (grad=…) is float64 host code: the sweep runner takes
// gradients from the CPU versions whatever the device.
#include <vector>

#include "attnprobe/estimators/registry.h"
#include "attnprobe/estimators/yoso/lsh.h"
#include "attnprobe/estimators/yoso/lsh_cuda.h"
#include "attnprobe/estimators/yoso/yoso/yoso.h"
#include "attnprobe/estimators/yoso/yoso/yoso_cuda_params.h"

namespace attnprobe::gpu {
namespace {

class CudaYoso final : public Estimator {
 public:
  explicit CudaYoso(YosoParams params) : params_(params) {}
  void estimate(const HeadView& view, const EstimateContext& ctx, MatrixF& out) const override {
    const int m = params_.m, tau = params_.tau;
    const bool hadamard = params_.hash == LshKind::kHadamard;
    std::vector<uint32_t> query_codes(view.n() * m), key_codes(view.k.rows() * m);
    // input=l2 hashes the rows as they are (a sign ignores the norm), input=lift the lifted rows in
    // p + 2 dims: the CPU version's inputs, so the codes agree bit for bit.
    MatrixD q_hat, k_hat;
    if (params_.lift) yoso_inputs(view.q, view.k, true, q_hat, k_hat);
    const MatrixD& q = params_.lift ? q_hat : view.q;
    const MatrixD& k = params_.lift ? k_hat : view.k;
    lsh_codes(q.data(), q.rows(), q.cols(), m, tau, hadamard, ctx.key, query_codes.data());
    lsh_codes(k.data(), k.rows(), k.cols(), m, tau, hadamard, ctx.key, key_codes.data());
    out.resize(view.n(), view.pv());
    yoso_tables_cuda({.query_codes = query_codes.data(),
                      .key_codes = key_codes.data(),
                      .v = view.vf.data(),
                      .n = view.n(),
                      .keys = view.k.rows(),
                      .pv = view.pv(),
                      .m = m,
                      .tau = tau,
                      .y = out.data()});
    if (params_.normalize)
      for (int64_t i = 0; i < out.rows(); ++i) {
        const float norm = out.row(i).norm();
        if (norm > 0) out.row(i) /= norm;
      }
  }

 private:
  YosoParams params_;
};

[[maybe_unused]] const bool kOnCuda = register_implementation<YosoParams>(
    "yoso", Device::kCuda, [](const YosoParams& params) { return std::make_unique<CudaYoso>(params); });

}  // namespace
}  // namespace attnprobe::gpu
