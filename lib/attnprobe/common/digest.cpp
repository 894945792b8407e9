#include "attnprobe/common/digest.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string_view>
#include <vector>

#include "attnprobe/common/error.h"
#include "attnprobe/common/text.h"

namespace attnprobe {

std::string file_digest(const std::string& path) {
  constexpr uint64_t kWholeFileLimit = uint64_t{64} << 20;
  constexpr uint64_t kBlock = 4096, kBlocks = 1024;
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw InputError(fmt::format("cannot read '{}': {}", path, std::strerror(errno)));
  const uint64_t size = static_cast<uint64_t>(in.tellg());
  uint64_t h = kFnv1aStart;  // over the chosen bytes, in order
  std::vector<char> buffer(1 << 20);
  auto hash_range = [&](uint64_t offset, uint64_t length) {
    in.seekg(static_cast<std::streamoff>(offset));
    while (length > 0) {
      const uint64_t chunk = std::min<uint64_t>(length, buffer.size());
      in.read(buffer.data(), static_cast<std::streamsize>(chunk));
      if (static_cast<uint64_t>(in.gcount()) != chunk)
        throw InputError(
            fmt::format("reading '{}' failed at byte {}: the file changed while it was read?", path, offset));
      h = fnv1a(std::string_view(buffer.data(), chunk), h);
      offset += chunk;
      length -= chunk;
    }
  };
  if (size <= kWholeFileLimit) {
    hash_range(0, size);
  } else {
    for (uint64_t b = 0; b < kBlocks; ++b) hash_range((size - kBlock) / (kBlocks - 1) * b, kBlock);
  }
  return fmt::format("{} bytes, digest {:016x}", size, h);
}

}  // namespace attnprobe
