#pragma once
// Every file that must never be seen half-written (run.json, a rewritten CSV, a summary, a check
// report, a synthetic dump) is written through this helper: the contents go to a temporary file in
// the same folder, which is flushed, synced and renamed over the target, so a reader or a crash
// sees the old file or the new one, never a mix; on failure the temporary file is removed. A target
// that is a device or a pipe (/dev/stdout) is written in place, never replaced.
#include <string>

namespace attnprobe {

/// Writes `contents` to `path` atomically (in place when `path` is a device or a pipe). Throws
/// InputError naming the path on failure, a full disk included.
void write_file_atomically(const std::string& path, const std::string& contents);

}  // namespace attnprobe
