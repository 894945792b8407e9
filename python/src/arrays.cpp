#include "arrays.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "attnprobe/common/error.h"

namespace attnprobe::python {

namespace {

// Whether `a` can be read in place as a strided matrix of Scalar (positive, element-aligned strides).
// Needs the GIL: the dtype test makes and drops a reference to a numpy dtype object.
template <class Scalar>
bool mappable(const py::array& a) {
  if (!py::isinstance<py::array_t<Scalar>>(a)) return false;
  for (int d = 0; d < 2; ++d)
    if (a.strides(d) < 0 || a.strides(d) % static_cast<py::ssize_t>(sizeof(Scalar)) != 0) return false;
  return true;
}

}  // namespace

Input prepared(const py::array& given, const char* name) {
  if (given.ndim() != 2)
    throw UsageError(fmt::format("{} must be a 2-D array (tokens × dim), got {} dimension{}", name, given.ndim(),
                                 given.ndim() == 1 ? "" : "s"));
  const char kind = given.dtype().kind();
  if (kind != 'f')
    throw UsageError(fmt::format("{} must hold floating-point numbers (float16/32/64), got dtype {}", name,
                                 std::string(py::str(given.dtype()))));
  const bool float32 = mappable<float>(given);
  const py::array a = float32 || mappable<double>(given)
                          ? given
                          : py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(given);
  const auto item = static_cast<py::ssize_t>(float32 ? sizeof(float) : sizeof(double));
  Input in;
  in.owner = a;
  in.data = a.data();
  in.rows = a.shape(0);
  in.cols = a.shape(1);
  in.row_stride = a.strides(0) / item;
  in.col_stride = a.strides(1) / item;
  in.float64 = !float32;
  in.name = name;
  return in;
}

QKV prepared(const py::array& q, const py::array& k, const py::array& v) {
  return {prepared(q, "q"), prepared(k, "k"), prepared(v, "v")};
}

PoolLease::PoolLease(int threads) {
  static std::mutex table_mutex;
  static std::map<int, std::pair<std::unique_ptr<std::mutex>, std::unique_ptr<ThreadPool>>> pools;
  const int count = resolve_threads(threads);
  std::lock_guard<std::mutex> lock(table_mutex);
  auto& entry = pools[count];
  if (!entry.first) entry = {std::make_unique<std::mutex>(), std::make_unique<ThreadPool>(count)};
  if (entry.first->try_lock()) {
    held_ = entry.first.get();
    pool_ = entry.second.get();
  } else {
    own_ = std::make_unique<ThreadPool>(count);
    pool_ = own_.get();
  }
}

PoolLease::~PoolLease() {
  if (held_) held_->unlock();
}

namespace {

double default_scale(std::optional<double> scale, int64_t p) {
  if (!scale) return 1.0 / std::sqrt(static_cast<double>(p));  // as a dump without a scale attribute
  require_usage(std::isfinite(*scale) && *scale > 0, "scale must be a positive finite number, got {}", *scale);
  return *scale;
}

// Rows [r0, r0 + rows) of a prepared() array into `dst` (float64) and `dstf` (float32), already
// sized. One read of the input: a float64 array is copied into dst and dst's block (still in cache)
// cast into dstf; a float32 array is copied into dstf and dstf's block cast into dst.
void assign_rows(const Input& a, MatrixD& dst, MatrixF& dstf, int64_t r0, int64_t rows) {
  if (a.float64) {
    if (a.c_contiguous())
      dst.middleRows(r0, rows) = a.dense_rows<double>(r0, rows);
    else
      dst.middleRows(r0, rows) = a.map<double>().middleRows(r0, rows);
    dstf.middleRows(r0, rows) = dst.middleRows(r0, rows).cast<float>();
  } else {
    if (a.c_contiguous())
      dstf.middleRows(r0, rows) = a.dense_rows<float>(r0, rows);
    else
      dstf.middleRows(r0, rows) = a.map<float>().middleRows(r0, rows);
    dst.middleRows(r0, rows) = dstf.middleRows(r0, rows).cast<double>();
  }
}

// Refuses a NaN, an infinity, or a float64 value beyond float32's range (the estimators compute in
// float32) in rows [r0, r0 + rows), as the dump readers do for files: an estimator given one returns
// NaN, or worse a finite number (YOSO's hashes see only signs). Checked on the float32 copy, which
// holds both.
void require_finite_rows(const Input& a, const MatrixD& dst, const MatrixF& dstf, int64_t r0, int64_t rows) {
  const auto [r, j] = first_non_finite(dstf.middleRows(r0, rows));
  if (r < 0) return;
  const int64_t i = r0 + r;
  throw UsageError(std::isfinite(dst(i, j))
                       ? fmt::format("{} holds {} at row {}, column {}: beyond float32's range, in which the "
                                     "estimators compute. Rescale the inputs.",
                                     a.name, dst(i, j), i, j)
                       : fmt::format("{} holds {} at row {}, column {}: attention of non-finite inputs has no "
                                     "reference. Find where the model produced it, or drop those tokens.",
                                     a.name, dst(i, j), i, j));
}

// A prepared() array into `dst` and `dstf`, in their memory when the shape is unchanged, in blocks
// of 64 rows (the second pass reads what the first just wrote from cache rather than from memory),
// the blocks spread over `pool`'s threads (the copy is memory-bound: a second core adds bandwidth).
void assign_matrix(const Input& a, MatrixD& dst, MatrixF& dstf, ThreadPool* pool) {
  constexpr int64_t kBlockRows = 64;
  dst.resize(a.rows, a.cols);
  dstf.resize(a.rows, a.cols);
  const int64_t blocks = (a.rows + kBlockRows - 1) / kBlockRows;
  auto block = [&](int64_t b) {
    const int64_t r0 = b * kBlockRows;
    const int64_t rows = std::min(kBlockRows, a.rows - r0);
    assign_rows(a, dst, dstf, r0, rows);
    require_finite_rows(a, dst, dstf, r0, rows);
  };
  for_each_index(pool, blocks, block);
}

// Slices up to this many float64 elements (q, k, v together) are built in memory kept per thread.
constexpr int64_t kReusedElements = int64_t{4} << 20;  // 32 MiB of float64 (+16 of float32): n = 32768 at p = 64

}  // namespace

QueryPlacement parse_placement(const std::string& mask, std::optional<std::vector<int64_t>> positions, bool cross,
                               const std::optional<py::array>& bias, double softcap, double alibi_slope,
                               bool bias_before_softcap) {
  const std::optional<MaskSpec> parsed = parse_mask(mask);
  require_usage(parsed.has_value(), "mask='{}': use 'full', 'causal' or 'window:W' (W >= 1 keys, e.g. 'window:4096')",
                mask);
  require_usage(!cross || parsed->mask == Mask::kFull,
                "cross=True with mask='{}': cross-attention queries have no positions among the keys, so only "
                "mask='full' applies; drop cross=True if q and k are one sequence",
                mask);
  require_usage(!cross || !positions,
                "cross=True with q_positions: cross-attention queries have no positions among the keys; drop one "
                "of the two");
  QueryPlacement placement{*parsed, std::move(positions), cross, {}};
  ScoreShaping& shaping = placement.shaping;
  require_usage(std::isfinite(softcap) && softcap >= 0,
                "softcap={}: give the cap c > 0 of the scores c*tanh(S/c), or leave it out (None or 0: none)", softcap);
  require_usage(std::isfinite(alibi_slope) && std::fabs(alibi_slope) <= 1e6,
                "alibi_slope={}: give this head's ALiBi slope m (adds m*(j - t) to key j's score for the query at "
                "position t), finite and at most 1e6 in size",
                alibi_slope);
  require_usage(!cross || alibi_slope == 0,
                "cross=True with alibi_slope: ALiBi is a bias by distance between query and key positions, which "
                "cross-attention queries do not have; pass the bias itself as bias=");
  shaping.softcap = softcap;
  shaping.alibi_slope = alibi_slope;
  shaping.bias_before_softcap = bias_before_softcap;
  if (bias) {
    const Input in = prepared(*bias, "bias");
    auto matrix = std::make_shared<MatrixD>(in.to_matrix_d());
    if (const auto [i, j] = first_non_finite(*matrix); i >= 0)
      throw UsageError(fmt::format(
          "bias[{}, {}] is {}: the bias must be finite (mask keys with mask= or a large negative value such as -1e30)",
          i, j, (*matrix)(i, j)));
    shaping.bias = std::move(matrix);
  }
  return placement;
}

namespace {

// The positions of `rows` query rows among `keys` keys into `view`: consecutive ones as first_position (a run
// ending at the last key is the bottom-right default, so giving those positions changes no bit), others as the
// explicit list. Refuses what no query row could be at.
void place_rows(HeadView& view, const std::vector<int64_t>& positions, int64_t rows, int64_t keys) {
  require_usage(static_cast<int64_t>(positions.size()) == rows,
                "q_positions has {} entries but q has {} rows: give one position per query row", positions.size(),
                rows);
  for (int64_t i = 0; i < rows; ++i) {
    require_usage(positions[i] >= 0 && positions[i] < keys,
                  "q_positions[{}] = {} is not a key position (0..{} for {} keys): the query at position t is the "
                  "token of key t",
                  i, positions[i], keys - 1, keys);
    require_usage(i == 0 || positions[i] > positions[i - 1],
                  "q_positions[{}] = {} follows q_positions[{}] = {}: positions must be strictly increasing (one "
                  "query row per token, in order)",
                  i, positions[i], i - 1, i == 0 ? 0 : positions[i - 1]);
  }
  const bool consecutive = positions.back() - positions.front() == rows - 1;
  view.first_position = consecutive ? positions.front() : 0;
  view.positions = consecutive ? std::vector<int64_t>() : positions;
}

}  // namespace

void fill_view(HeadView& view, const QKV& in, std::optional<double> scale, const QueryPlacement& placement, SliceId id,
               ThreadPool* pool) {
  const Input &q = in.q, &k = in.k, &v = in.v;
  const int64_t n = q.rows, p = q.cols, keys = k.rows;
  require_usage(n >= 1 && p >= 1, "q is {}x{}: it needs at least one token and one dimension", n, p);
  require_usage(k.cols == p, "k is {}x{} but q is {}x{}: keys need the queries' dimension", k.rows, k.cols, n, p);
  require_usage(keys >= 1, "k has no rows: attention needs at least one key");
  require_usage(v.rows == keys && v.cols >= 1, "v is {}x{} but k has {} rows: v needs one row per key", v.rows, v.cols,
                keys);
  require_usage(placement.cross || keys >= n,
                "q has {} rows but k only {}: each query row is one of the keys' tokens (the last ones unless "
                "q_positions says which); pass cross=True for cross-attention",
                n, keys);
  id.n = keys;  // the case's n is its keys, as the sweep's (the cache length of a decode step)
  view.id = id;
  view.scale = default_scale(scale, p);
  view.mask = placement.mask.mask;
  view.window = placement.mask.window;
  view.first_position = placement.cross ? 0 : keys - n;  // bottom-right alignment; cross rows have no position
  view.positions.clear();
  if (placement.positions) place_rows(view, *placement.positions, n, keys);
  require_usage(
      !placement.shaping.bias || (placement.shaping.bias->rows() == n && placement.shaping.bias->cols() == keys),
      "bias is {}x{} but q has {} rows and k {}: the bias holds one value per (query row, key), n_q x n_k",
      placement.shaping.bias ? placement.shaping.bias->rows() : 0,
      placement.shaping.bias ? placement.shaping.bias->cols() : 0, n, keys);
  view.shaping = placement.shaping;
  assign_matrix(q, view.q, view.qf, pool);
  assign_matrix(k, view.k, view.kf, pool);
  assign_matrix(v, view.v, view.vf, pool);
  const std::string problem = magnitude_problem(view.q, view.k, view.v, view.scale);
  require_usage(problem.empty(), "{}: rescale the inputs or pass a smaller scale", problem);
}

const HeadView& make_view(const QKV& in, std::optional<double> scale, const QueryPlacement& placement, SliceId id,
                          ThreadPool* pool) {
  thread_local HeadView view;
  if (in.q.rows * in.q.cols + in.k.rows * (in.k.cols + in.v.cols) > kReusedElements)
    view = HeadView();  // keep no huge slice alive
  fill_view(view, in, scale, placement, id, pool);
  return view;
}

py::array no_array() { return py::array_t<double>(std::vector<py::ssize_t>{0, 0}); }

}  // namespace attnprobe::python
