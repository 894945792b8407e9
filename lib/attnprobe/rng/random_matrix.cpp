#include "attnprobe/rng/random_matrix.h"

namespace attnprobe {

MatrixD normal_rows(const RandomStream& stream, int64_t rows, int64_t cols, uint32_t c) {
  MatrixD out(rows, cols);
  for (int64_t r = 0; r < rows; ++r) stream.normals(static_cast<uint32_t>(r), c, out.row(r).data(), cols);
  return out;
}

}  // namespace attnprobe
