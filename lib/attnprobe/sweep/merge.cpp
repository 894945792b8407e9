#include "attnprobe/sweep/merge.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <numeric>

#include "attnprobe/common/error.h"
#include "attnprobe/common/output_paths.h"
#include "attnprobe/metrics/catalogue.h"
#include "attnprobe/records/csv.h"
#include "attnprobe/sweep/shard.h"

namespace attnprobe {

CanonicalOrder::CanonicalOrder(const PlanRecord& plan) : plan_(plan), units_total_(plan.units_total) {
  for (const std::string& name : plan_.metrics) {
    const std::vector<Metric> parsed = parse_metrics(name);  // a name of this build (merge checks the version)
    std::vector<std::string>& list = is_case_metric(parsed.at(0)) ? case_metrics_ : trial_metrics_;
    metric_of_[name] = list.size();
    list.push_back(name);
  }
  int64_t offset = 0;
  for (size_t s = 0; s < plan_.settings.size(); ++s) {
    setting_offset_.push_back(offset);
    offset += static_cast<int64_t>(plan_.settings[s].trials) * static_cast<int64_t>(trial_metrics_.size());
    if (has_case_row(s)) offset += static_cast<int64_t>(case_metrics_.size());
    setting_of_[{plan_.settings[s].spec, plan_.settings[s].reference}] = s;
  }
  rows_per_unit_ = offset;
  for (size_t u = 0; u < plan_.units.size(); ++u) {
    const UnitRecord& unit = plan_.units[u];
    unit_of_[{unit.layer, unit.head, unit.batch, unit.n, unit.queries, unit.precision}] = u;
    unit_by_index_[unit.index] = u;
  }
}

bool CanonicalOrder::has_case_row(size_t s) const {
  return !case_metrics_.empty() && plan_.settings[s].trials >= 2;  // as the runner writes them
}

std::optional<int64_t> CanonicalOrder::position(const TrialRow& row, size_t* unit_out) const {
  const CaseKey& k = row.key;
  if (k.dump != plan_.dump || row.seed != plan_.seed || k.layer.is_all() || k.head.is_all() || k.batch.is_all() ||
      k.n.is_all())
    return std::nullopt;
  const auto unit = unit_of_.find({static_cast<int>(k.layer.value()), static_cast<int>(k.head.value()),
                                   static_cast<int>(k.batch.value()), k.n.value(), k.queries, k.precision});
  const auto setting = setting_of_.find({k.spec, k.reference});
  const auto metric = metric_of_.find(row.metric);
  if (unit == unit_of_.end() || setting == setting_of_.end() || metric == metric_of_.end()) return std::nullopt;
  const UnitRecord& u = plan_.units[unit->second];
  const SettingRecord& s = plan_.settings[setting->second];
  const std::optional<long long> samples = k.samples ? std::optional<long long>(*k.samples) : std::nullopt;
  if (k.p != u.p || k.mask != u.mask || k.window != u.window || k.estimator != s.estimator || samples != s.samples)
    return std::nullopt;
  const int64_t base = u.index * rows_per_unit_ + setting_offset_[setting->second];
  const int64_t per_trial = static_cast<int64_t>(trial_metrics_.size());
  const bool case_metric = metric->second < case_metrics_.size() && case_metrics_[metric->second] == row.metric;
  int64_t at = 0;
  if (row.trial == kCaseTrial && case_metric && has_case_row(setting->second))
    at = base + s.trials * per_trial + static_cast<int64_t>(metric->second);
  else if (row.trial >= 0 && row.trial < s.trials && !case_metric)
    at = base + row.trial * per_trial + static_cast<int64_t>(metric->second);
  else
    return std::nullopt;
  if (unit_out) *unit_out = unit->second;
  return at;
}

TrialRow CanonicalOrder::row_at(int64_t position) const {
  const UnitRecord& u = plan_.units[unit_by_index_.at(position / rows_per_unit_)];
  const int64_t within = position % rows_per_unit_;
  const size_t s =
      std::upper_bound(setting_offset_.begin(), setting_offset_.end(), within) - setting_offset_.begin() - 1;
  const SettingRecord& setting = plan_.settings[s];
  TrialRow row;
  row.key = CaseKey{.dump = plan_.dump,
                    .layer = u.layer,
                    .head = u.head,
                    .batch = u.batch,
                    .n = u.n,
                    .p = u.p,
                    .mask = u.mask,
                    .window = u.window,
                    .queries = u.queries,
                    .estimator = setting.estimator,
                    .spec = setting.spec,
                    .samples = setting.samples ? std::optional<int64_t>(*setting.samples) : std::nullopt,
                    .reference = setting.reference,
                    .precision = u.precision};
  row.seed = plan_.seed;
  const int64_t per_trial = static_cast<int64_t>(trial_metrics_.size());
  const int64_t offset = within - setting_offset_[s];
  if (offset >= setting.trials * per_trial) {  // the case row
    row.trial = kCaseTrial;
    row.metric = case_metrics_.at(offset - setting.trials * per_trial);
  } else {
    row.trial = offset / per_trial;
    row.metric = trial_metrics_.at(offset % per_trial);
  }
  return row;
}

std::string describe_row(const TrialRow& row) {
  return fmt::format("case layer={};head={};batch={};n={};spec={} vs {} (dump {}, seed {}), trial {}, metric {}",
                     row.key.layer.text(), row.key.head.text(), row.key.batch.text(), row.key.n.text(), row.key.spec,
                     row.key.reference, row.key.dump, row.seed, row.trial, row.metric);
}

namespace {

struct Shard {
  std::string csv;
  RunInfo info;
};

Shard read_shard(const std::string& csv) {
  if (!std::filesystem::exists(csv)) throw InputError(fmt::format("shard '{}' does not exist", csv));
  const std::string json = existing_run_info_path(csv);
  if (!std::filesystem::exists(json))
    throw InputError(fmt::format(
        "shard '{}' has no run.json beside it ('{}'): merge needs it to know which part of which sweep the file "
        "holds. Keep each shard's NAME.run.json next to its NAME.csv.",
        csv, json));
  Shard shard{csv, read_run_info(json)};
  if (!shard.info.plan)
    throw InputError(fmt::format(
        "'{}' records no plan: it was written by an attnprobe older than `merge`, or not by `sweep`. Rerun the "
        "sweep with this version.",
        json));
  return shard;
}

// Every way two shards can belong to different sweeps, named.
void require_same_sweep(const Shard& a, const Shard& b) {
  const PlanRecord &pa = *a.info.plan, &pb = *b.info.plan;
  auto differ = [&](const std::string& what, const std::string& va, const std::string& vb) {
    throw InputError(
        fmt::format("'{}' and '{}' are not shards of one sweep: {} differs ({} vs {})", a.csv, b.csv, what, va, vb));
  };
  if (a.info.version != b.info.version || a.info.git_hash != b.info.git_hash)
    differ("the attnprobe that wrote them", fmt::format("{} git {}", a.info.version, a.info.git_hash),
           fmt::format("{} git {}", b.info.version, b.info.git_hash));
  if (pa.seed != pb.seed) differ("the seed", std::to_string(pa.seed), std::to_string(pb.seed));
  if (pa.dump != pb.dump) differ("the dump", pa.dump, pb.dump);
  if (!a.info.dump_fingerprint.empty() && !b.info.dump_fingerprint.empty() &&
      a.info.dump_fingerprint != b.info.dump_fingerprint)
    differ("the dump's contents", a.info.dump_fingerprint, b.info.dump_fingerprint);
  if (pa.settings != pb.settings) {
    auto list = [](const PlanRecord& p) {
      std::vector<std::string> out;
      for (const SettingRecord& s : p.settings) out.push_back(fmt::format("{} x{}", s.spec, s.trials));
      return fmt::format("{}", fmt::join(out, ", "));
    };
    differ("the estimator settings (or --trials, --reference)", list(pa), list(pb));
  }
  if (pa.metrics != pb.metrics)
    differ("--metrics", fmt::format("{}", fmt::join(pa.metrics, ",")), fmt::format("{}", fmt::join(pb.metrics, ",")));
  if (pa.units_total != pb.units_total || pa.fingerprint != pb.fingerprint)
    differ("the grid (layers, heads, batch items, lengths)",
           fmt::format("{} units, fingerprint {}", pa.units_total, pa.fingerprint),
           fmt::format("{} units, fingerprint {}", pb.units_total, pb.fingerprint));
  if (pa.shard_count != pb.shard_count)
    differ("the number of shards", fmt::format("{} is shard {}/{}", a.csv, pa.shard_index, pa.shard_count),
           fmt::format("{} is shard {}/{}", b.csv, pb.shard_index, pb.shard_count));
}

}  // namespace

MergeResult merge_shards(const std::vector<std::string>& inputs, const std::string& output, bool overwrite,
                         RunInfo info) {
  if (inputs.empty()) throw UsageError("merge needs the shard CSVs to join (e.g. out/shard-*.csv)");
  std::error_code ec;
  // Onto one of its own shards or their run.json (under any name: a link, ./): with --overwrite it replaced
  // that shard, so the shard set could never be merged again.
  std::vector<NamedPath> read;
  for (const std::string& input : inputs) {
    read.push_back({"the shard", input});
    read.push_back({"the shard's run.json", existing_run_info_path(input)});
  }
  require_separate_files(read, {{"-o", output}, {"its run.json", run_info_path(output)}});
  const std::filesystem::file_status status = std::filesystem::status(output, ec);
  if (std::filesystem::exists(status) && !std::filesystem::is_regular_file(status))
    throw InputError(fmt::format("'{}' is {}, not a CSV file: give -o a file path", output,
                                 std::filesystem::is_directory(status) ? "a directory" : "not a regular file"));
  if (!overwrite && std::filesystem::exists(status) && std::filesystem::file_size(output, ec) > 0)
    throw UsageError(fmt::format("'{}' already exists: add --overwrite to replace it", output));
  info.started = iso_time_now();

  std::vector<Shard> shards;
  for (const std::string& csv : inputs) {
    shards.push_back(read_shard(csv));
    require_same_sweep(shards.front(), shards.back());
  }
  const PlanRecord& first = *shards.front().info.plan;
  const int count = first.shard_count;
  std::vector<int> file_of_shard(count, -1);
  for (size_t f = 0; f < shards.size(); ++f) {
    const PlanRecord& plan = *shards[f].info.plan;
    int& slot = file_of_shard.at(plan.shard_index);
    if (slot >= 0)
      throw InputError(fmt::format("shard {}/{} is given twice: '{}' and '{}' (duplicated shard)", plan.shard_index,
                                   count, shards[slot].csv, shards[f].csv));
    slot = static_cast<int>(f);
  }
  for (int s = 0; s < count; ++s)
    if (file_of_shard[s] < 0)
      throw InputError(fmt::format(
          "shard {}/{} is missing: the inputs hold shards {} of {} (missing shard). Run it with the same sweep "
          "command and --shard {}/{}, then merge all {}.",
          s, count,
          [&] {
            std::vector<int> have;
            for (int i = 0; i < count; ++i)
              if (file_of_shard[i] >= 0) have.push_back(i);
            return fmt::format("{}", fmt::join(have, ","));
          }(),
          count, s, count, count));
  for (const Shard& shard : shards)
    if (shard.info.finished.empty())
      throw InputError(fmt::format(
          "shard '{}' ({}/{}) is incomplete (truncated shard): its run.json says the run never finished. Rerun its "
          "sweep command with --resume, then merge again.",
          shard.csv, shard.info.plan->shard_index, count));

  // The whole plan: every shard's units, each dealt exactly once.
  PlanRecord whole = first;
  whole.units.clear();
  std::map<long long, int> shard_of_unit;
  for (const Shard& shard : shards)
    for (const UnitRecord& u : shard.info.plan->units) {
      const auto [it, added] = shard_of_unit.emplace(u.index, shard.info.plan->shard_index);
      if (!added)
        throw InputError(fmt::format("unit {} is in both shard {} and shard {} of {}: '{}' is not a shard of this deal",
                                     unit_name(u), it->second, shard.info.plan->shard_index, count, shard.csv));
      whole.units.push_back(u);
    }
  std::sort(whole.units.begin(), whole.units.end(),
            [](const UnitRecord& a, const UnitRecord& b) { return a.index < b.index; });
  if (static_cast<long long>(whole.units.size()) != whole.units_total ||
      (!whole.units.empty() && whole.units.back().index != whole.units_total - 1))
    throw InputError(fmt::format("the shards' run.json files list {} units of a plan of {}: a shard record is damaged",
                                 whole.units.size(), whole.units_total));
  whole.shard_index = 0;
  whole.shard_count = 1;

  const CanonicalOrder order(whole);
  std::vector<std::optional<TrialRow>> slots(order.size());
  std::vector<int> slot_file(order.size(), -1);
  for (size_t f = 0; f < shards.size(); ++f) {
    const Shard& shard = shards[f];
    const int index = shard.info.plan->shard_index;
    CsvContents contents = read_csv(shard.csv);
    if (contents.summary)
      throw InputError(fmt::format("'{}' is a summary CSV; merge joins the trial CSVs of sweep --shard", shard.csv));
    if (contents.truncated_tail)
      throw InputError(fmt::format(
          "shard '{}' ({}/{}) ends in a partial line (truncated shard): it was cut off while writing. Rerun its "
          "sweep command with --resume, then merge again.",
          shard.csv, index, count));
    for (TrialRow& row : contents.trials) {
      size_t unit = 0;
      const std::optional<int64_t> at = order.position(row, &unit);
      if (!at)
        throw InputError(fmt::format("'{}' (shard {}/{}) holds a foreign row, not of this sweep's plan: {}", shard.csv,
                                     index, count, describe_row(row)));
      const int owner = shard_of_unit.at(whole.units[unit].index);
      if (owner != index)
        throw InputError(
            fmt::format("'{}' (shard {}/{}) holds a row of shard {}/{} (foreign row; duplicated work?): {}", shard.csv,
                        index, count, owner, count, describe_row(row)));
      if (slots[*at])
        throw InputError(fmt::format("'{}' (shard {}/{}) holds a row twice (duplicated row): {}", shard.csv, index,
                                     count, describe_row(row)));
      slots[*at] = std::move(row);
      slot_file[*at] = static_cast<int>(f);
    }
  }
  const int64_t missing = std::count_if(slots.begin(), slots.end(), [](const auto& s) { return !s; });
  if (missing) {
    const int64_t at = std::find_if(slots.begin(), slots.end(), [](const auto& s) { return !s; }) - slots.begin();
    const TrialRow expected = order.row_at(at);
    size_t unit = 0;
    order.position(expected, &unit);
    const int owner = shard_of_unit.at(whole.units[unit].index);
    throw InputError(fmt::format(
        "'{}' (shard {}/{}) lacks rows (missing rows): {}{}. Rerun its sweep command with --resume, then merge again.",
        shards[file_of_shard[owner]].csv, owner, count, describe_row(expected),
        missing > 1 ? fmt::format(", and {} more rows", missing - 1) : ""));
  }

  std::vector<TrialRow> rows;
  rows.reserve(slots.size());
  for (std::optional<TrialRow>& s : slots) rows.push_back(std::move(*s));
  const std::filesystem::path path(output);
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
  rewrite_trial_csv(output, rows);

  const RunInfo& base = shards.front().info;
  info.dump = base.dump;
  info.dump_fingerprint = base.dump_fingerprint;
  info.device = base.device;
  info.threads = base.threads;
  info.seed = first.seed;
  info.merged_from = inputs;
  info.plan = whole;
  info.rows_written = static_cast<long long>(rows.size());
  info.finished = iso_time_now();
  MergeResult result{count, whole.units_total, static_cast<int64_t>(rows.size()), run_info_path(output)};
  write_run_info(result.info_path, info);
  return result;
}

std::vector<TrialRow> canonical_rows(const PlanRecord& plan, std::vector<TrialRow> rows) {
  const CanonicalOrder order(plan);
  std::vector<std::pair<int64_t, size_t>> keys;  // (position or past-the-end, input order)
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::optional<int64_t> at = order.position(rows[i]);
    keys.emplace_back(at ? *at : order.size(), i);
  }
  std::sort(keys.begin(), keys.end());
  std::vector<TrialRow> out;
  out.reserve(rows.size());
  for (const auto& [at, i] : keys) out.push_back(std::move(rows[i]));
  return out;
}

}  // namespace attnprobe
