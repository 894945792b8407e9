#pragma once
// The one rule for what a command may write: no file it writes (a CSV, its run.json, a JSON report, a
// dump) may be one of the files it reads, nor may two of its outputs be one file. Paths are compared
// as files, not as strings: through links, ./, ../ and hard links. Every subcommand and the Python
// front end call this before any work, so a mistyped -o can never replace the data it was given.
#include <string>
#include <vector>

namespace attnprobe {

/// A file a command reads or writes, with the option or role that named it ("the dump", "-o", "run.json").
struct NamedPath {
  std::string role;
  std::string path;
};

/// True when `a` and `b` name one file: the same inode when both exist, else the same resolved path.
bool same_file(const std::string& a, const std::string& b);

/// Throws UsageError (exit 2) naming both roles and paths when an output is an input or two outputs
/// are one file. Empty paths (an option not given) are skipped; devices and pipes (/dev/stdout) may repeat.
void require_separate_files(const std::vector<NamedPath>& inputs, const std::vector<NamedPath>& outputs);

}  // namespace attnprobe
