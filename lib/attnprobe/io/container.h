#pragma once
// The storage side of a dump (docs/dumps.md, "Containers"): one interface over HDF5, safetensors and
// .npz, chosen by the file's magic bytes. A container knows named arrays (their shape and element
// type), layer groups, number and string attributes, and reads a rectangular block of an array as
// float64. Everything about what the arrays mean (layers, layouts, heads, lengths, value checks)
// lives in dump.cpp, once for every container. Opening reads only headers; block reads are lazy.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace attnprobe {

/// Shape and element type of one stored array.
struct TensorInfo {
  std::vector<int64_t> shape;  ///< row-major dimensions (empty: a 0-d scalar)
  std::string dtype;           ///< bfloat16 | float16 | float32 | float64 | int32 | int64 | ...
  bool floating = false;       ///< a floating type attnprobe reads as q/k/v/dy
  bool integer = false;        ///< an integer type (lengths)
  bool compressed = false;     ///< stored through a filter (gzip, deflate)
};

class Container {
 public:
  virtual ~Container() = default;

  virtual std::string format() const = 0;  ///< "HDF5", "safetensors", "npz"
  virtual std::string noun() const = 0;    ///< what the format calls an array: dataset, tensor, array

  /// Names of the layer groups present (layer_<digits>), in any order.
  virtual std::vector<std::string> layer_groups() const = 0;
  /// The array `member` ("q", "lengths", ...) of group `group` ("layer_03"; "" for the root).
  virtual std::string member_name(const std::string& group, const std::string& member) const = 0;
  /// The group an array name belongs to (the inverse of member_name; "" for the root).
  virtual std::string group_of(const std::string& name) const = 0;

  virtual bool has_tensor(const std::string& name) const = 0;
  /// Shape and type of an existing array; throws InputError naming file and array when its storage
  /// cannot be read as declared.
  virtual TensorInfo tensor(const std::string& name) const = 0;

  /// A one-number attribute (scale, causal) of a group; nullopt when absent; InputError when present
  /// but not one number.
  virtual std::optional<double> number_attribute(const std::string& group, const std::string& name) const = 0;
  /// A root string attribute (model, source, created_by); "" when absent.
  virtual std::string string_attribute(const std::string& name) const = 0;

  /// Reads the block [start, start + count) of array `name` (one start/count per dimension) as
  /// row-major float64 into `out` (prod(count) values). Throws InputError naming file and array
  /// when the stored bytes cannot be decoded.
  virtual void read(const std::string& name, const std::vector<int64_t>& start, const std::vector<int64_t>& count,
                    double* out) const = 0;
};

/// The base of the containers that hold one flat map of arrays named "layer_00.q", "layer_00.scale"
/// (safetensors, .npz): a group is the part of a name before its last dot.
class DottedContainer : public Container {
 public:
  std::vector<std::string> layer_groups() const override;
  std::string member_name(const std::string& group, const std::string& member) const override {
    return group.empty() ? member : group + "." + member;
  }
  std::string group_of(const std::string& name) const override {
    const size_t dot = name.rfind('.');
    return dot == std::string::npos ? "" : name.substr(0, dot);
  }

 protected:
  /// Every array name the file holds.
  virtual std::vector<std::string> array_names() const = 0;
};

/// Opens `path` as the container its first bytes announce (HDF5 signature, "PK\3\4" zip = .npz,
/// otherwise an 8-byte little-endian length followed by '{' = safetensors). Throws InputError
/// naming the file when it is none of them or its header is malformed.
std::unique_ptr<Container> open_container(const std::string& path);

std::unique_ptr<Container> open_hdf5_container(const std::string& path);
std::unique_ptr<Container> open_safetensors_container(const std::string& path);
std::unique_ptr<Container> open_npz_container(const std::string& path);

}  // namespace attnprobe
