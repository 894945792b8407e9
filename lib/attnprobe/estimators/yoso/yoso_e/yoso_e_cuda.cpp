// The CUDA version of `yoso-e` (yoso_e.cpp), with its causal form (input=l2; the registry refuses
// input=lift under a causal mask). input=lift lifts on the host (yoso_inputs) and the kernel takes p + 2 dims.
#include "attnprobe/estimators/registry.h"
#include "attnprobe/estimators/yoso/lsh.h"
#include "attnprobe/estimators/yoso/yoso_e/yoso_e.h"
#include "attnprobe/estimators/yoso/yoso_e/yoso_e_cuda_params.h"

namespace attnprobe::gpu {
namespace {

class CudaYosoExpectation final : public Estimator {
 public:
  explicit CudaYosoExpectation(YosoExpectationParams params) : params_(params) {}
  void estimate(const HeadView& view, const EstimateContext&, MatrixF& out) const override {
    MatrixD q_hat, k_hat;  // ℓ2 rows, or lifted rows in p + 2 dims (input=lift), as on the CPU
    yoso_inputs(view.q, view.k, params_.lift, q_hat, k_hat);
    const MatrixF q = q_hat.cast<float>(), k = k_hat.cast<float>();
    out.resize(view.n(), view.pv());
    yoso_expectation_cuda({.q_hat = q.data(),
                           .k_hat = k.data(),
                           .v = view.vf.data(),
                           .n = view.n(),
                           .keys = k.rows(),
                           .p = q.cols(),
                           .pv = view.pv(),
                           .tau = params_.tau,
                           .causal = view.mask == Mask::kCausal,
                           .out = out.data()});
  }

 private:
  YosoExpectationParams params_;
};

[[maybe_unused]] const bool kOnCuda = register_implementation<YosoExpectationParams>(
    "yoso-e", Device::kCuda,
    [](const YosoExpectationParams& params) { return std::make_unique<CudaYosoExpectation>(params); });

}  // namespace
}  // namespace attnprobe::gpu
