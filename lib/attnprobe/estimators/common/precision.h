#pragma once
// One slice in either precision, for estimators written once as a template over the scalar type:
// the registered estimator runs the float32 instantiation (as an efficient kernel would), and
// tests run the float64 one where an identity or an exact limit must hold to 1e-12, which float32
// rounding (~1e-7) cannot show.
#include <type_traits>

#include "attnprobe/common/matrix.h"
#include "attnprobe/view/head_view.h"

namespace attnprobe {

template <typename S>
using MatrixT = Eigen::Matrix<S, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <typename S>
using VectorT = Eigen::Matrix<S, Eigen::Dynamic, 1>;
template <typename S>
using RowVectorT = Eigen::Matrix<S, 1, Eigen::Dynamic>;

/// Q (n × p), K (n × p), V (n × pv) of a view in precision S (float: qf/kf/vf, double: q/k/v).
template <typename S>
struct SliceData {
  const MatrixT<S>& q;
  const MatrixT<S>& k;
  const MatrixT<S>& v;
};

template <typename S>
SliceData<S> slice_data(const HeadView& view) {
  static_assert(std::is_same_v<S, float> || std::is_same_v<S, double>);
  if constexpr (std::is_same_v<S, float>)
    return {view.qf, view.kf, view.vf};
  else
    return {view.q, view.k, view.v};
}

}  // namespace attnprobe
