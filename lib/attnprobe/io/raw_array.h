#pragma once
// Arrays stored as raw little-endian bytes in row-major order (safetensors tensors, .npy arrays):
// element types, their sizes, the byte count a shape needs (overflow-checked) and the block copy
// that widens every element to float64. bfloat16 → float32 is exact (the 16 bits are the top half
// of a float32); float16 → float32 is exact (every half, subnormals included, is a float32).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace attnprobe {

enum class RawType { kBFloat16, kFloat16, kFloat32, kFloat64, kInt32, kInt64 };

size_t raw_type_size(RawType type);
std::string raw_type_name(RawType type);  ///< bfloat16 | float16 | float32 | float64 | int32 | int64
bool raw_type_floating(RawType type);

/// prod(shape) · element_size, or nullopt when it overflows uint64 (a hostile header).
std::optional<uint64_t> raw_byte_count(const std::vector<int64_t>& shape, size_t element_size);

/// float16 bits → float (exact).
float half_to_float(uint16_t bits);
/// bfloat16 bits → float (exact).
float bfloat16_to_float(uint16_t bits);

/// Copies the block [start, start + count) of a row-major array of `shape` and `type` starting at
/// `data` into `out` (prod(count) float64 values, row-major). The caller has checked that `data`
/// holds the whole array and that the block lies inside `shape`.
void read_raw_block(const unsigned char* data, RawType type, const std::vector<int64_t>& shape,
                    const std::vector<int64_t>& start, const std::vector<int64_t>& count, double* out);

/// Read-only memory map of a whole file (the size is taken once, at open; callers check every
/// offset against size() before touching the bytes, so a short file is an error, not a SIGBUS).
class MappedFile {
 public:
  explicit MappedFile(const std::string& path);  ///< throws InputError naming the file
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const unsigned char* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  const unsigned char* data_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace attnprobe
