#pragma once
// Matrix conventions, stated once: every matrix is row-major, one token per row
// (Q, K: n × p, V: n × pv, outputs: n × pv). Row-major keeps score blocks and softmax rows
// contiguous (a column-major row softmax at n = 4096 is ~10× slower, docs/performance.md).
#include <Eigen/Dense>

namespace attnprobe {

using MatrixF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatrixD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using VectorF = Eigen::VectorXf;
using VectorD = Eigen::VectorXd;
using RowVectorF = Eigen::RowVectorXf;
using RowVectorD = Eigen::RowVectorXd;

}  // namespace attnprobe
