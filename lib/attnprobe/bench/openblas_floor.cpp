#include "attnprobe/bench/openblas_floor.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <cstdlib>

namespace attnprobe {

namespace {
// CBLAS enum values (cblas.h): row-major 101, no-transpose 111, transpose 112.
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;
}  // namespace

OpenBlasFloor& OpenBlasFloor::instance() {
  static OpenBlasFloor floor;
  return floor;
}

OpenBlasFloor::OpenBlasFloor() {
  std::string forced;
  if (!std::getenv("OPENBLAS_CORETYPE")) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f"))
      forced = "SkylakeX";
    else if (__builtin_cpu_supports("avx2"))
      forced = "Haswell";
    if (!forced.empty()) setenv("OPENBLAS_CORETYPE", forced.c_str(), 0);
  }
  void* handle = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
  if (!handle) handle = dlopen("libopenblas.so", RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    description_ = "OpenBLAS not installed (apt-get install libopenblas0)";
    return;
  }
  sgemm_ = reinterpret_cast<SgemmFn>(dlsym(handle, "cblas_sgemm"));
  set_threads_ = reinterpret_cast<SetThreadsFn>(dlsym(handle, "openblas_set_num_threads"));
  auto core = reinterpret_cast<char* (*)()>(dlsym(handle, "openblas_get_corename"));
  auto config = reinterpret_cast<char* (*)()>(dlsym(handle, "openblas_get_config"));
  if (!sgemm_ || !set_threads_) {
    sgemm_ = nullptr;
    description_ = "libopenblas has no cblas_sgemm/openblas_set_num_threads";
    return;
  }
  description_ = fmt::format("{} core {}{}", config ? config() : "OpenBLAS", core ? core() : "?",
                             forced.empty() ? "" : " (OPENBLAS_CORETYPE set by attnprobe from CPU features)");
}

void OpenBlasFloor::set_threads(int threads) const {
  if (set_threads_) set_threads_(threads);
}

void OpenBlasFloor::sgemm(bool transpose_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
                          int ldb, float beta, float* c, int ldc) const {
  sgemm_(kRowMajor, kNoTrans, transpose_b ? kTrans : kNoTrans, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

}  // namespace attnprobe
