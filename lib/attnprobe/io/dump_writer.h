#pragma once
// Writing dumps: used by `attnprobe synth` and by tests that need files of a given shape, type
// or damage. Arrays are written as given (any rank), so tests can also write malformed dumps.
#include <hdf5.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace attnprobe {

enum class StoredType { kFloat16, kFloat32, kFloat64 };

/// A dense row-major array of any rank (values as double; converted to the stored type).
struct DumpArray {
  std::vector<hsize_t> shape;
  std::vector<double> values;
};

struct DumpLayer {
  std::string name;                           ///< e.g. "layer_00"
  std::map<std::string, DumpArray> datasets;  ///< usually q, k, v
  std::optional<double> scale;
  std::optional<int> causal;
  std::optional<std::vector<int64_t>> lengths;
  std::map<std::string, int64_t> integer_attributes;  ///< e.g. window, cross
  std::map<std::string, double> real_attributes;      ///< e.g. softcap
  std::map<std::string, DumpArray> integer_datasets;  ///< stored as int64, e.g. q_positions
};

struct DumpContents {
  std::map<std::string, std::string> attributes;  ///< root string attributes (model, source, created_by)
  std::vector<DumpLayer> layers;
};

struct DumpWriteOptions {
  StoredType type = StoredType::kFloat32;
  int gzip_level = 0;  ///< 0: contiguous, no filter; 1..9: chunked + deflate
};

/// Writes `contents` to `path` (overwriting). Object timestamps are off so that the same
/// contents give the same bytes. Throws InputError if the file cannot be written.
void write_dump(const std::string& path, const DumpContents& contents, const DumpWriteOptions& options);

StoredType parse_stored_type(const std::string& name);  ///< f16|float16, f32|float32, f64|float64

}  // namespace attnprobe
