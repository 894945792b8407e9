#include "attnprobe/sweep/sweep_setup.h"

namespace attnprobe {

SweepSetup set_up_sweep(Dump dump, const SweepOptions& options) {
  SweepPlan plan = plan_sweep(dump, options.request);
  std::vector<int64_t> costs = unit_costs(dump, plan);
  ShardPlan part = plan_shard(dump, plan, costs, options.shard.value_or(ShardSpec{}));
  RunInfo info = sweep_run_info(options.command_line, dump.path(), options.threads, options.device, plan.seed);
  info.plan = part.record;
  info.dump_fingerprint = dump.fingerprint();
  RunOptions run;
  run.threads = options.threads;
  run.device = parse_device(options.device);
  return SweepSetup{std::move(dump), std::move(plan), std::move(costs),
                    std::move(part), std::move(run),  std::move(info)};
}

}  // namespace attnprobe
