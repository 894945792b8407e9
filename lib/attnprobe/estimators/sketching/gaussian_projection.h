#pragma once
// The Gaussian projections of linformer and linformer-jlt (E, d × n, and S, n × d): entry (r, t) is
// float(std)·float_normal(r, t) of a stream, in float32, so the CPU versions, the CUDA ones and the
// tiles drawn on the fly all draw the same matrix. Drawn in float arithmetic, four per Philox block: ~2.6×
// cheaper than rounding float64 Box–Muller (a third of a Linformer call).
#include <cstdint>

#include "attnprobe/common/matrix.h"
#include "attnprobe/rng/random_stream.h"

namespace attnprobe {

/// Entries t0 … t0 + count − 1 of row `row`: scale·float_normal(row, t) into out (count floats).
void gaussian_row(const RandomStream& stream, int64_t row, int64_t t0, int64_t count, float scale, float* out);

/// rows × cols, entry (r, t) = float(stddev) · float_normal(r, t) of `stream` (row r of the matrix is row r
/// of the stream's float normal sequence), in float32. Cost O(rows·cols).
MatrixF gaussian_matrix(int64_t rows, int64_t cols, double stddev, const RandomStream& stream);

}  // namespace attnprobe
