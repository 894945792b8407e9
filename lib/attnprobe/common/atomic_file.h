#pragma once
// Every file that must never be seen half-written (run.json, a rewritten CSV, a summary, a check
// report, a synthetic dump) is written through this helper: the contents go to a temporary file in
// the same folder, which is flushed, synced and renamed over the target, so a reader or a crash
// sees the old file or the new one, never a mix; on failure the temporary file is removed.
#include <functional>
#include <string>

namespace attnprobe {

/// Writes `contents` to `path` atomically. Throws InputError naming the path on failure.
void write_file_atomically(const std::string& path, const std::string& contents);

/// For writers that need a path of their own (HDF5): `write(temp_path)` fills the temporary file,
/// which then replaces `path`. Throws InputError naming `path` when the rename fails; the temporary
/// file is removed when `write` throws.
void replace_file_atomically(const std::string& path, const std::function<void(const std::string& temp)>& write);

}  // namespace attnprobe
