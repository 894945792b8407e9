#pragma once
// The machine's fp32 FMA ceiling, measured: `bench` reports exact attention's GFLOP/s against it.

namespace attnprobe {

/// GFLOP/s of `threads` threads each running independent chains of vector FMAs (the widest the
/// build targets: AVX-512, AVX2+FMA, or scalar) for about `seconds`. Counts 2 flops per lane.
double measure_fma_peak_gflops(int threads, double seconds = 0.3);

/// "avx512", "avx2-fma" or "scalar": what measure_fma_peak_gflops used.
const char* fma_peak_isa();

}  // namespace attnprobe
