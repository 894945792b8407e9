// Raw little-endian row-major arrays (raw_array.h): element decoding and block copies. Cost of a
// block read: one pass over the block's elements, contiguous runs along the last dimension.
#include "attnprobe/io/raw_array.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>

#include "attnprobe/common/error.h"

namespace attnprobe {

static_assert(std::endian::native == std::endian::little,
              "safetensors and .npy dumps are little-endian; a big-endian host would need byte swaps");

size_t raw_type_size(RawType type) {
  switch (type) {
    case RawType::kBFloat16:
    case RawType::kFloat16:
      return 2;
    case RawType::kFloat32:
    case RawType::kInt32:
      return 4;
    case RawType::kFloat64:
    case RawType::kInt64:
      return 8;
  }
  return 0;
}

std::string raw_type_name(RawType type) {
  switch (type) {
    case RawType::kBFloat16:
      return "bfloat16";
    case RawType::kFloat16:
      return "float16";
    case RawType::kFloat32:
      return "float32";
    case RawType::kFloat64:
      return "float64";
    case RawType::kInt32:
      return "int32";
    case RawType::kInt64:
      return "int64";
  }
  return "";
}

bool raw_type_floating(RawType type) { return type != RawType::kInt32 && type != RawType::kInt64; }

std::optional<uint64_t> raw_byte_count(const std::vector<int64_t>& shape, size_t element_size) {
  unsigned __int128 bytes = element_size;
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    bytes *= static_cast<uint64_t>(d);
    if (bytes > UINT64_MAX) return std::nullopt;
  }
  return static_cast<uint64_t>(bytes);
}

float half_to_float(uint16_t bits) {
  const uint32_t sign = (bits >> 15) & 1u, exponent = (bits >> 10) & 0x1Fu, mantissa = bits & 0x3FFu;
  float magnitude;
  if (exponent == 0)
    magnitude = std::ldexp(static_cast<float>(mantissa), -24);  // subnormal (or zero): m · 2^-24, exact
  else if (exponent == 31)
    magnitude = mantissa ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  else
    magnitude = std::ldexp(static_cast<float>(mantissa | 0x400u), static_cast<int>(exponent) - 25);
  return sign ? -magnitude : magnitude;
}

float bfloat16_to_float(uint16_t bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

namespace {

// Widens `n` consecutive elements at `p` to float64 (memcpy: the bytes need not be aligned).
void widen(const unsigned char* p, RawType type, int64_t n, double* out) {
  for (int64_t i = 0; i < n; ++i) {
    switch (type) {
      case RawType::kBFloat16:
      case RawType::kFloat16: {
        uint16_t bits;
        std::memcpy(&bits, p + 2 * i, 2);
        out[i] = type == RawType::kBFloat16 ? bfloat16_to_float(bits) : half_to_float(bits);
        break;
      }
      case RawType::kFloat32: {
        float value;
        std::memcpy(&value, p + 4 * i, 4);
        out[i] = value;
        break;
      }
      case RawType::kFloat64:
        std::memcpy(out + i, p + 8 * i, 8);
        break;
      case RawType::kInt32: {
        int32_t value;
        std::memcpy(&value, p + 4 * i, 4);
        out[i] = value;
        break;
      }
      case RawType::kInt64: {
        int64_t value;
        std::memcpy(&value, p + 8 * i, 8);
        out[i] = static_cast<double>(value);
        break;
      }
    }
  }
}

}  // namespace

void read_raw_block(const unsigned char* data, RawType type, const std::vector<int64_t>& shape,
                    const std::vector<int64_t>& start, const std::vector<int64_t>& count, double* out) {
  const size_t rank = shape.size(), size = raw_type_size(type);
  if (rank == 0) {
    widen(data, type, 1, out);
    return;
  }
  // Row-major strides in elements; the last dimension is contiguous.
  std::vector<int64_t> stride(rank, 1);
  for (size_t d = rank - 1; d > 0; --d) stride[d - 1] = stride[d] * shape[d];
  int64_t outer = 1;
  for (size_t d = 0; d + 1 < rank; ++d) outer *= count[d];
  const int64_t run = count[rank - 1];
  std::vector<int64_t> index(rank, 0);  // position inside the block, outer dimensions only
  for (int64_t r = 0; r < outer; ++r) {
    int64_t offset = start[rank - 1];
    for (size_t d = 0; d + 1 < rank; ++d) offset += (start[d] + index[d]) * stride[d];
    widen(data + static_cast<uint64_t>(offset) * size, type, run, out + r * run);
    for (size_t d = rank - 1; d-- > 0;) {  // odometer over the outer dimensions
      if (++index[d] < count[d]) break;
      index[d] = 0;
    }
  }
}

MappedFile::MappedFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  require_input(fd >= 0, "cannot read '{}': {}. Check the path (and permissions).", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int error = errno;
    ::close(fd);
    throw InputError(fmt::format("cannot stat '{}': {}.", path, std::strerror(error)));
  }
  size_ = static_cast<uint64_t>(st.st_size);
  if (size_ > 0) {
    void* map = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    const int error = errno;
    ::close(fd);
    require_input(map != MAP_FAILED, "cannot map '{}' into memory: {}.", path, std::strerror(error));
    data_ = static_cast<const unsigned char*>(map);
  } else {
    ::close(fd);
  }
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<unsigned char*>(data_), size_);
}

}  // namespace attnprobe
