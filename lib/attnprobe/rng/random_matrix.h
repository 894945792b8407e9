#pragma once
// Matrices of keyed draws (random_stream.h's streams in the library's row-major matrices).
#include <cstdint>

#include "attnprobe/common/matrix.h"
#include "attnprobe/rng/random_stream.h"

namespace attnprobe {

/// A rows × cols matrix of standard normals, row r = elements 0..cols−1 of the stream's normal sequence of
/// row (r, c): the one way a matrix of Gaussians is drawn (inputs, projections, upstream gradients).
MatrixD normal_rows(const RandomStream& stream, int64_t rows, int64_t cols, uint32_t c = 0);

}  // namespace attnprobe
