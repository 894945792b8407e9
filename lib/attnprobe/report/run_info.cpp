#include "attnprobe/report/run_info.h"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <ctime>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "attnprobe/common/atomic_file.h"
#include "attnprobe/version.h"

namespace attnprobe {

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
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  const nlohmann::ordered_json json = {
      {"command_line", info.command_line},
      {"version", kVersion},
      {"git_hash", kGitHash},
      {"build_type", kBuildType},
      {"host", host},
      {"dump", info.dump},
      {"device", info.device},
      {"threads", info.threads},
      {"seed", info.seed},
      {"resumed", info.resumed},
      {"plan", info.plan},
      {"pid", info.pid},
      {"started", info.started},
      {"finished", info.finished.empty() ? nlohmann::ordered_json(nullptr) : nlohmann::ordered_json(info.finished)},
      {"rows_written", info.rows_written},
  };
  write_file_atomically(path, json.dump(2) + "\n");
}

}  // namespace attnprobe
