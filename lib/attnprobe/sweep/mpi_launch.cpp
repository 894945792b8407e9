// MPI launch detection and the refusal of an MPI launch in a build without MPI (mpi_sweep.h). Read
// from the environment only, so it costs nothing and needs no MPI library.
#include <fmt/format.h>

#include <cstdlib>

#include "attnprobe/common/error.h"
#include "attnprobe/common/text.h"
#include "attnprobe/sweep/mpi_sweep.h"

namespace attnprobe {

namespace {

std::optional<int64_t> env_int(const char* name) {
  const char* text = std::getenv(name);
  int64_t v = 0;
  if (!text || !parse_int(text, v)) return std::nullopt;
  return v;
}

}  // namespace

std::optional<MpiLaunch> mpi_launch_from_environment() {
  // (size variable, rank variable) per launcher, most specific first.
  static const std::pair<const char*, const char*> kLaunchers[] = {
      {"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"},
      {"PMI_SIZE", "PMI_RANK"},
      {"MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_RANK"},
      {"PMIX_SIZE", "PMIX_RANK"},
  };
  for (const auto& [size_name, rank_name] : kLaunchers) {
    const std::optional<int64_t> size = env_int(size_name), rank = env_int(rank_name);
    if (size && *size >= 1) return MpiLaunch{static_cast<int>(rank.value_or(0)), static_cast<int>(*size), size_name};
  }
  return std::nullopt;
}

bool mpi_compiled() {
#ifdef ATTNPROBE_HAVE_MPI
  return true;
#else
  return false;
#endif
}

std::string mpi_refusal(const std::optional<MpiLaunch>& launch, bool compiled) {
  if (compiled || !launch || launch->size <= 1) return "";
  return fmt::format(
      "this attnprobe was built without MPI, but it runs as rank {} of {} of an MPI launch ({} is set): every "
      "rank would compute the whole grid into the same file. Rebuild with MPI (install libopenmpi-dev, configure "
      "with -DATTNPROBE_MPI=ON), run one process, or split the grid with --shard I/N and `attnprobe merge`.",
      launch->rank, launch->size, launch->variable);
}

#ifndef ATTNPROBE_HAVE_MPI
MpiSweepResult run_mpi_sweep(const Dump&, const SweepPlan&, const std::vector<int64_t>&, const std::string&, OutputMode,
                             RunOptions, RunInfo) {
  throw UsageError(mpi_refusal(mpi_launch_from_environment().value_or(MpiLaunch{0, 2, "an MPI launch"}), false));
}
#endif

}  // namespace attnprobe
