#pragma once
// A file's digest (not for security: it tells inputs apart), for the dump fingerprint that lets
// `sweep --resume` refuse a dump regenerated under the same name.
#include <string>

namespace attnprobe {

/// "<size> bytes, digest <16 hex digits>" of a file's contents: every byte of a file up to 64 MiB, else
/// 1024 blocks of 4 KiB spread evenly from its first byte to its last (headers, and values throughout).
/// A larger file changed only between the sampled blocks keeps its digest. Throws InputError naming the
/// file when it cannot be read.
std::string file_digest(const std::string& path);

}  // namespace attnprobe
