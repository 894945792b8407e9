#include "attnprobe/report/run_info.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "attnprobe/common/atomic_file.h"
#include "attnprobe/common/error.h"
#include "attnprobe/common/parallel.h"
#include "attnprobe/version.h"

namespace attnprobe {

RunInfo sweep_run_info(std::vector<std::string> command_line, std::string dump, int threads, std::string device,
                       unsigned long long seed) {
  RunInfo info;
  info.command_line = std::move(command_line);
  info.dump = std::move(dump);
  info.threads = resolve_threads(threads);
  info.device = std::move(device);
  info.seed = seed;
  return info;
}

std::string iso_time_now() {
  std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm utc{};
  gmtime_r(&now, &utc);
  char buffer[32];
  std::strftime(buffer, sizeof buffer, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return buffer;
}

std::string attnprobe_version() { return fmt::format("{} (git {}, {})", kVersion, kGitHash, kBuildType); }

std::string run_info_path(const std::string& csv_path) { return csv_path + ".run.json"; }

std::string existing_run_info_path(const std::string& csv_path) {
  const std::string current = run_info_path(csv_path);
  std::error_code ec;
  const std::filesystem::path p(csv_path);
  if (std::filesystem::exists(current, ec) || p.extension() != ".csv") return current;
  const std::string older = (p.parent_path() / (p.stem().string() + ".run.json")).string();
  return std::filesystem::exists(older, ec) ? older : current;
}

namespace {

using Json = nlohmann::ordered_json;

// Units as compact arrays [index, layer, head, batch, n, p], with a 7th element, the mask ("causal",
// "window:W"), for units under another mask than full, and an 8th, the query rows ("last:W"), for units of
// other rows than all (files written before either existed read as full and all): a whole-model plan has
// tens of thousands of them.
Json plan_json(const PlanRecord& plan) {
  Json settings = Json::array();
  for (const SettingRecord& s : plan.settings)
    settings.push_back({{"estimator", s.estimator},
                        {"spec", s.spec},
                        {"samples", s.samples ? Json(*s.samples) : Json(nullptr)},
                        {"reference", s.reference},
                        {"trials", s.trials}});
  Json units = Json::array();
  for (const UnitRecord& u : plan.units) {
    Json unit = {u.index, u.layer, u.head, u.batch, u.n, u.p};
    // Trailing fields only where not full, all and f32, so the units of earlier plans keep their form.
    const bool f32 = u.precision == Precision::kF32;
    if (u.mask != Mask::kFull || !u.queries.all() || !f32) unit.push_back(mask_text(u.mask, u.window));
    if (!u.queries.all() || !f32) unit.push_back(query_rows_text(u.queries));
    if (!f32) unit.push_back(precision_name(u.precision));
    units.push_back(std::move(unit));
  }
  return {{"dump", plan.dump},
          {"seed", plan.seed},
          {"settings", settings},
          {"metrics", plan.metrics},
          {"eps", plan.eps},
          {"units_total", plan.units_total},
          {"fingerprint", plan.fingerprint},
          {"shard", {{"index", plan.shard_index}, {"count", plan.shard_count}}},
          {"units", units}};
}

PlanRecord plan_from_json(const Json& j) {
  PlanRecord plan;
  plan.dump = j.at("dump").get<std::string>();
  plan.seed = j.at("seed").get<unsigned long long>();
  for (const Json& s : j.at("settings"))
    plan.settings.push_back(SettingRecord{
        .estimator = s.at("estimator").get<std::string>(),
        .spec = s.at("spec").get<std::string>(),
        .samples = s.at("samples").is_null() ? std::nullopt : std::optional(s.at("samples").get<long long>()),
        .reference = s.at("reference").get<std::string>(),
        .trials = s.at("trials").get<int>()});
  plan.metrics = j.at("metrics").get<std::vector<std::string>>();
  plan.eps = j.value("eps", 0.05);
  plan.units_total = j.at("units_total").get<long long>();
  plan.fingerprint = j.at("fingerprint").get<std::string>();
  plan.shard_index = j.at("shard").at("index").get<int>();
  plan.shard_count = j.at("shard").at("count").get<int>();
  for (const Json& u : j.at("units")) {
    const std::optional<MaskSpec> mask = u.size() > 6 ? parse_mask(u.at(6).get<std::string>()) : MaskSpec{};
    const std::optional<QueryRows> queries = u.size() > 7 ? parse_query_rows(u.at(7).get<std::string>()) : QueryRows{};
    if (!mask || !queries) throw std::invalid_argument("a plan unit's mask or query rows are not valid");
    Precision precision = Precision::kF32;
    if (u.size() > 8) {
      const std::string name = u.at(8).get<std::string>();
      const auto known = std::find_if(std::begin(kAllPrecisions), std::end(kAllPrecisions),
                                      [&](Precision p) { return name == precision_name(p); });
      if (known == std::end(kAllPrecisions)) throw std::invalid_argument("a plan unit's precision is not valid");
      precision = *known;
    }
    plan.units.push_back(UnitRecord{.index = u.at(0).get<long long>(),
                                    .layer = u.at(1).get<int>(),
                                    .head = u.at(2).get<int>(),
                                    .batch = u.at(3).get<int>(),
                                    .n = u.at(4).get<long long>(),
                                    .p = u.at(5).get<long long>(),
                                    .mask = mask->mask,
                                    .window = mask->window,
                                    .queries = *queries,
                                    .precision = precision});
  }
  return plan;
}

}  // namespace

void write_run_info(const std::string& path, const RunInfo& info) {
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  Json json = {
      {"command_line", info.command_line},
      {"version", kVersion},
      {"git_hash", kGitHash},
      {"build_type", kBuildType},
      {"host", host},
      {"dump", info.dump},
      {"dump_fingerprint", info.dump_fingerprint},
      {"device", info.device},
      {"threads", info.threads},
      {"seed", info.seed},
      {"resumed", info.resumed},
      {"pid", info.pid},
      {"started", info.started},
      {"finished", info.finished.empty() ? Json(nullptr) : Json(info.finished)},
      {"rows_written", info.rows_written},
  };
  if (!info.interrupted.empty()) json["interrupted"] = info.interrupted;
  if (!info.merged_from.empty()) json["merged_from"] = info.merged_from;
  if (info.plan) json["plan"] = plan_json(*info.plan);
  write_file_atomically(path, json.dump(2) + "\n");
}

RunInfo read_run_info(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(fmt::format("cannot read '{}': {}", path, std::strerror(errno)));
  std::stringstream text;
  text << in.rdbuf();
  try {
    const Json j = Json::parse(text.str());
    RunInfo info;
    info.command_line = j.at("command_line").get<std::vector<std::string>>();
    info.version = j.at("version").get<std::string>();
    info.git_hash = j.at("git_hash").get<std::string>();
    info.dump = j.value("dump", "");
    info.dump_fingerprint = j.value("dump_fingerprint", "");
    info.device = j.value("device", "cpu");
    info.threads = j.value("threads", 0);
    info.seed = j.at("seed").get<unsigned long long>();
    info.resumed = j.value("resumed", false);
    info.started = j.value("started", "");
    info.finished = j.at("finished").is_null() ? "" : j.at("finished").get<std::string>();
    info.rows_written = j.value("rows_written", 0LL);
    info.interrupted = j.value("interrupted", "");
    if (j.contains("merged_from")) info.merged_from = j.at("merged_from").get<std::vector<std::string>>();
    if (j.contains("plan")) info.plan = plan_from_json(j.at("plan"));
    return info;
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("'{}' is not a run.json that attnprobe wrote: {}", path, e.what()));
  } catch (const std::invalid_argument& e) {  // a plan unit's mask, query rows or precision
    throw InputError(fmt::format("'{}' is not a run.json that attnprobe wrote: {}", path, e.what()));
  }
}

}  // namespace attnprobe
