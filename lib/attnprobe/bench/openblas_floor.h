#pragma once
// OpenBLAS, loaded at run time for one purpose: the sgemm speed floor in `attnprobe bench`.
//
// Why at run time: OpenBLAS (DYNAMIC_ARCH builds, as Debian ships) picks its kernels from the
// CPUID model when the library is loaded. On VMs that report a generic "Intel Xeon Processor" it
// picks "Prescott" (SSE3), 4–5× below the machine. Setting OPENBLAS_CORETYPE from the features
// the CPU does report, before dlopen, gives the floor the machine really has.
#include <string>

namespace attnprobe {

class OpenBlasFloor {
 public:
  /// Loads libopenblas.so.0 (or .so); available() is false when it is not installed.
  static OpenBlasFloor& instance();
  bool available() const { return sgemm_ != nullptr; }
  /// e.g. "OpenBLAS 0.3.21 ... SkylakeX", or why it is unavailable.
  const std::string& description() const { return description_; }
  void set_threads(int threads) const;
  /// Row-major C = alpha·A·op(B) + beta·C, op = transpose when transpose_b.
  void sgemm(bool transpose_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b, int ldb,
             float beta, float* c, int ldc) const;

 private:
  OpenBlasFloor();
  using SgemmFn = void (*)(int, int, int, int, int, int, float, const float*, int, const float*, int, float, float*,
                           int);
  using SetThreadsFn = void (*)(int);
  SgemmFn sgemm_ = nullptr;
  SetThreadsFn set_threads_ = nullptr;
  std::string description_;
};

}  // namespace attnprobe
