// Uses the installed library: parses a spec, runs the estimator on a small synthetic slice and
// compares it with exact attention. Prints "ok" and exits 0 when the registry and estimators work.
// It also includes a header that includes <hdf5.h> (io/dump_writer.h), so the package's HDF5 target must
// give a C++-only project HDF5's include directory.
#include <cstdio>

#include "attnprobe/estimators/registry.h"
#include "attnprobe/exact/exact_attention.h"
#include "attnprobe/io/dump_writer.h"
#include "attnprobe/rng/random_stream.h"

int main() {
  using namespace attnprobe;
  const int64_t n = 64, p = 16;
  MatrixD q = MatrixD::Random(n, p), k = MatrixD::Random(n, p), v = MatrixD::Random(n, p);
  const HeadView view = make_head_view(SliceId{0, 0, 0, n}, 0.25, q, k, v);
  const Spec spec = parse_spec("softmax");
  MatrixF out;
  spec.make()->estimate(view, EstimateContext{make_random_key(0, "consumer", 0), nullptr}, out);
  const double error = (out.cast<double>() - exact_attention_f64(q, k, v, 0.25)).norm();
  const bool hdf5_types = parse_stored_type("f32") == StoredType::kFloat32 && sizeof(hsize_t) == 8;
  const bool ok = error < 1e-4 && registered_estimators().size() > 5 && hdf5_types;
  std::printf("%s: %zu estimators registered, softmax error %.2g\n", ok ? "ok" : "FAILED",
              registered_estimators().size(), error);
  return ok ? 0 : 1;
}
