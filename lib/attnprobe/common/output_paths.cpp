#include "attnprobe/common/output_paths.h"

#include <filesystem>
#include <system_error>

#include "attnprobe/common/error.h"

namespace attnprobe {

namespace fs = std::filesystem;

bool same_file(const std::string& a, const std::string& b) {
  std::error_code ea, eb, ec;
  if (fs::exists(a, ea) && fs::exists(b, eb)) return fs::equivalent(a, b, ec) && !ec;
  const fs::path ra = fs::weakly_canonical(fs::absolute(a, ea), ea);
  const fs::path rb = fs::weakly_canonical(fs::absolute(b, eb), eb);
  return !ea && !eb && ra == rb;
}

namespace {
// /dev/stdout twice (summarize -o /dev/stdout) is a stream, not a file that could be replaced.
bool is_stream(const std::string& path) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  return !ec && (fs::is_character_file(status) || fs::is_fifo(status));
}
}  // namespace

void require_separate_files(const std::vector<NamedPath>& inputs, const std::vector<NamedPath>& outputs) {
  for (size_t i = 0; i < outputs.size(); ++i) {
    const NamedPath& out = outputs[i];
    if (out.path.empty() || is_stream(out.path)) continue;
    for (const NamedPath& in : inputs)
      if (!in.path.empty() && same_file(in.path, out.path))
        throw UsageError(fmt::format(
            "{} '{}' is {} '{}': the command would overwrite its own input. Write the output to another file.",
            out.role, out.path, in.role, in.path));
    for (size_t j = 0; j < i; ++j)
      if (!outputs[j].path.empty() && same_file(outputs[j].path, out.path))
        throw UsageError(fmt::format("{} '{}' and {} '{}' are one file: give them different names.", outputs[j].role,
                                     outputs[j].path, out.role, out.path));
  }
}

}  // namespace attnprobe
