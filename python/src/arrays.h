#pragma once
// numpy arrays in and out of attnprobe._core (docs/python.md): inputs read in place where numpy's
// layout allows, checked and copied into the library's row-major slices once; outputs handed to numpy
// without a copy; and the thread pools the calls reuse. Matrices: q is n × p (query rows), k keys × p,
// v keys × pv (keys ≥ n, or any count for cross-attention), outputs n × pv, all row-major (C order)
// float64 or float32.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "attnprobe/common/matrix.h"
#include "attnprobe/common/parallel.h"
#include "attnprobe/view/head_view.h"

namespace attnprobe::python {

namespace py = pybind11;

template <class Scalar>
using StridedMap = Eigen::Map<const Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>, 0,
                              Eigen::Stride<Eigen::Dynamic, Eigen::Dynamic>>;

// A 2-D float array as the code that runs without the GIL reads it: data, shape, strides and element
// type, all asked of numpy by prepared() with the GIL held. The GIL-free code must not ask numpy
// itself: a dtype test (py::isinstance<py::array_t<T>>) changes a dtype object's reference count, and
// the copy into the library's matrices runs on pool threads. It did once, and float64's reference
// count drifted by tens per 3000 calls, with an occasional segfault when it reached zero.
struct Input {
  py::object owner;  // keeps the data alive; copied and dropped with the GIL held
  const void* data = nullptr;
  int64_t rows = 0, cols = 0;
  int64_t row_stride = 0, col_stride = 0;  // in elements
  bool float64 = true;
  const char* name = "";  // the argument's name, for messages

  template <class Scalar>
  StridedMap<Scalar> map() const {
    return StridedMap<Scalar>(static_cast<const Scalar*>(data), rows, cols,
                              Eigen::Stride<Eigen::Dynamic, Eigen::Dynamic>(row_stride, col_stride));
  }
  // Whether the rows are one dense block, which Eigen copies with vector loads (the strided map
  // copies element by element).
  bool c_contiguous() const { return col_stride == 1 && row_stride == cols; }
  template <class Scalar>
  Eigen::Map<const Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>> dense_rows(
      int64_t r0, int64_t count) const {
    return {static_cast<const Scalar*>(data) + r0 * cols, count, cols};
  }
  // As a float64 matrix, read in place (one pass, no numpy temporary).
  MatrixD to_matrix_d() const { return float64 ? MatrixD(map<double>()) : MatrixD(map<float>().cast<double>()); }
};

// Checks that `a` is a 2-D float array and describes it for the GIL-free code: itself when it is
// float64 or float32 with element-aligned positive strides, else a float64 C-order copy made by numpy
// (float16, long double, negative strides). Needs the GIL.
Input prepared(const py::array& given, const char* name);

// A slice's three prepared() arrays.
struct QKV {
  Input q, k, v;
};

QKV prepared(const py::array& q, const py::array& k, const py::array& v);

// numpy arrays that own a library matrix (moved, not copied): the capsule frees it with the array.
template <class Matrix>
py::array to_numpy(Matrix&& m) {
  using Scalar = typename std::decay_t<Matrix>::Scalar;
  auto* owned = new std::decay_t<Matrix>(std::move(m));
  py::capsule base(owned, [](void* p) { delete static_cast<std::decay_t<Matrix>*>(p); });
  const auto rows = static_cast<py::ssize_t>(owned->rows()), cols = static_cast<py::ssize_t>(owned->cols());
  const auto item = static_cast<py::ssize_t>(sizeof(Scalar));
  return py::array_t<Scalar>({rows, cols}, {cols * item, item}, owned->data(), base);
}

// A pool per thread count, reused across calls (starting threads costs ~0.1 ms a call). A pool runs one
// parallel_for at a time, so a caller that finds it busy (another Python thread) gets a fresh one.
class PoolLease {
 public:
  explicit PoolLease(int threads);
  ~PoolLease();
  ThreadPool* get() const { return pool_; }

 private:
  std::mutex* held_ = nullptr;
  ThreadPool* pool_ = nullptr;
  std::unique_ptr<ThreadPool> own_;
};

// Where a call's query rows sit among its keys (DESIGN §11, docs/python.md): the mask, and explicit
// positions, else bottom-right alignment (row i at keys − n + i, FlashAttention's convention for
// seqlen_q ≠ seqlen_k); or cross-attention, whose queries have no positions, so only the full mask applies.
// With them, what the model does to the scores (bias=, softcap=, alibi_slope=, bias_before_softcap=;
// view/score_shaping.h): a call's geometry and shaping travel together.
struct QueryPlacement {
  MaskSpec mask;
  std::optional<std::vector<int64_t>> positions;
  bool cross = false;
  ScoreShaping shaping;
};

// Python's mask= ("full" | "causal" | "window:W"), q_positions= and cross=, refusing what cross-attention
// cannot mean (a mask that needs positions, or positions), and the score shaping: `bias` a 2-D float array (n_q ×
// n_k, checked against q and k by fill_view), `softcap` ≥ 0 (0: none), `alibi_slope` (0: none; not with cross).
// Needs the GIL.
QueryPlacement parse_placement(const std::string& mask, std::optional<std::vector<int64_t>> positions, bool cross,
                               const std::optional<py::array>& bias = std::nullopt, double softcap = 0,
                               double alibi_slope = 0, bool bias_before_softcap = false);

// Checks shapes and positions and builds the slice the library works on in `view` (float64 as given,
// float32 copies), in its memory when the shape is unchanged. Runs without the GIL: the Inputs' owners
// keep the arrays alive.
void fill_view(HeadView& view, const QKV& in, std::optional<double> scale, const QueryPlacement& placement, SliceId id,
               ThreadPool* pool);

// fill_view into a per-thread view reused from call to call: on the VMs this was measured on,
// first-touching fresh pages costs ~1 ms per 2 MiB, as much as a whole performer(M=64) call at n = 4096
// spends on its own arithmetic, while `bench` builds its slice once. The returned view is valid until
// this thread's next call.
const HeadView& make_view(const QKV& in, std::optional<double> scale, const QueryPlacement& placement, SliceId id,
                          ThreadPool* pool);

/// attnprobe.Slice: q, k, v and the scale converted once (float64 and float32 copies), for many
/// estimate() calls on one slice without rebuilding it: what `bench` times.
struct Slice {
  HeadView view;
  bool cross = false;  ///< cross-attention: the rows have no positions (the view places them at 0..n−1, full mask)
};

// A placeholder for the q, k, v arguments when a Slice carries them.
py::array no_array();

}  // namespace attnprobe::python
