#include "attnprobe/estimators/sketching/gaussian_projection.h"

namespace attnprobe {

void gaussian_row(const RandomStream& stream, int64_t row, int64_t t0, int64_t count, float scale, float* out) {
  stream.float_normals(static_cast<uint32_t>(row), 0, out, count, static_cast<uint32_t>(t0));
  for (int64_t c = 0; c < count; ++c) out[c] *= scale;
}

MatrixF gaussian_matrix(int64_t rows, int64_t cols, double stddev, const RandomStream& stream) {
  MatrixF out(rows, cols);
  for (int64_t r = 0; r < rows; ++r) gaussian_row(stream, r, 0, cols, static_cast<float>(stddev), out.row(r).data());
  return out;
}

}  // namespace attnprobe
