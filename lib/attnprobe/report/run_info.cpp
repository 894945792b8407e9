#include "attnprobe/report/run_info.h"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>

#include "attnprobe/common/error.h"
#include "attnprobe/version.h"

namespace attnprobe {

namespace {
std::string json_string(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20)
          out += fmt::format("\\u{:04x}", c);
        else
          out += static_cast<char>(c);
    }
  }
  return out + "\"";
}
}  // namespace

std::string iso_time_now() {
  std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm utc{};
  gmtime_r(&now, &utc);
  char buffer[32];
  std::strftime(buffer, sizeof buffer, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return buffer;
}

std::string attnprobe_version() { return fmt::format("{} (git {}, {})", kVersion, kGitHash, kBuildType); }

std::string run_info_path(const std::string& csv_path) {
  std::filesystem::path p(csv_path);
  return (p.parent_path() / (p.stem().string() + ".run.json")).string();
}

void write_run_info(const std::string& path, const RunInfo& info) {
  std::vector<std::string> args;
  for (const std::string& a : info.command_line) args.push_back(json_string(a));
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  const std::string text = fmt::format(
      "{{\n  \"command_line\": [{}],\n  \"version\": {},\n  \"git_hash\": {},\n  \"build_type\": {},\n"
      "  \"host\": {},\n  \"dump\": {},\n  \"device\": {},\n  \"threads\": {},\n  \"seed\": {},\n"
      "  \"resumed\": {},\n  \"started\": {},\n  \"finished\": {},\n  \"rows_written\": {}\n}}\n",
      fmt::join(args, ", "), json_string(kVersion), json_string(kGitHash), json_string(kBuildType), json_string(host),
      json_string(info.dump), json_string(info.device), info.threads, info.seed, info.resumed ? "true" : "false",
      json_string(info.started), info.finished.empty() ? "null" : json_string(info.finished), info.rows_written);
  const std::string temp = path + ".tmp";
  {
    std::ofstream out(temp);
    out << text;
    if (!out) throw InputError(fmt::format("cannot write '{}'", temp));
  }
  std::filesystem::rename(temp, path);
}

}  // namespace attnprobe
