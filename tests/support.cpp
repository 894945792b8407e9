#define CATCH_CONFIG_MAIN
#include "support.h"

#include <array>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

namespace attnprobe::test {

namespace {
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "attnprobe-test-XXXXXX").string();
    path = mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};
}  // namespace

const std::filesystem::path& temp_dir() {
  static TempDir dir;
  return dir.path;
}

std::string temp_path(const std::string& name) { return (temp_dir() / name).string(); }

CommandResult run_attnprobe(const std::string& args) {
  const std::string command = std::string(ATTNPROBE_BINARY) + " " + args + " 2>&1";
  CommandResult result;
  FILE* pipe = popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::array<char, 4096> buffer;
  size_t got;
  while ((got = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) result.output.append(buffer.data(), got);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

std::string write_synth(const std::string& name, const SynthOptions& options, StoredType type, int gzip) {
  const std::string path = temp_path(name);
  write_dump(path, make_synthetic_dump(options), DumpWriteOptions{type, gzip});
  return path;
}

std::string shared_data(const std::string& name) {
  const std::filesystem::path path = std::filesystem::path(ATTNPROBE_SHARED_DATA) / name;
  return std::filesystem::exists(path) ? path.string() : "";
}

void report_skip(const std::string& why) {
  std::cout << "SKIPPED: " << why << std::endl;
  if (std::getenv("ATTNPROBE_UNDER_CTEST")) std::exit(77);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace attnprobe::test
