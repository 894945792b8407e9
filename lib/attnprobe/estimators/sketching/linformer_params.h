#pragma once
// The decoded parameters of linformer and linformer-jlt, and their Gaussian projection, shared by
// the CPU versions (linformer.cpp) and the CUDA ones (gpu/linformer.cu), so both use the same E.
#include <cmath>

#include "attnprobe/estimators/registry.h"
#include "attnprobe/rng/random_stream.h"

namespace attnprobe {

struct LinformerParams {
  int64_t d = 64;     ///< projected length (linformer) or sketch width (linformer-jlt)
  double stddev = 0;  ///< std of E's entries; 0 means 1/√d (linformer-jlt always uses 1/√d)

  /// The std actually used: stddev, or 1/√d when it is 0.
  double effective_stddev() const { return stddev > 0 ? stddev : 1.0 / std::sqrt(static_cast<double>(d)); }

  static LinformerParams from_spec(const Spec& spec) {
    return {spec.get_int("d"), spec.def().name == "linformer" ? spec.get_real("std") : 0.0};
  }
};

/// rows × cols, entry (r, t) = float(stddev) · float_normal(r, t) of `stream` (row r of the matrix is row r
/// of the stream's float normal sequence), in float32. Cost O(rows·cols).
MatrixF gaussian_matrix(int64_t rows, int64_t cols, double stddev, const RandomStream& stream);

}  // namespace attnprobe
