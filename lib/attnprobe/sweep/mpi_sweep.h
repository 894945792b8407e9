#pragma once
// The MPI runner (`mpirun -n R attnprobe sweep ...`, docs/cli.md "Beyond one machine"). Every rank
// opens the dump and plans the same grid (the ranks check that their plan fingerprints agree).
// Rank 0 owns the output: it reconciles a resumed CSV, hands the unfinished work units out one at a
// time, largest estimated cost first, to whichever rank asks next (rank 0 computes too, on a thread
// of its own, so R ranks on R cores keep R cores busy), appends each finished unit's rows to the CSV
// with one flushed write, and at the end rewrites the file in the canonical order of a single-process
// run. Worker ranks compute each unit with their own --threads. A rank that dies loses its unit in
// flight (mpirun then ends the job); rerunning the same command with --resume computes only what is
// missing. The MPI part is compiled only when ATTNPROBE_MPI finds an MPI (mpi_compiled()); the launch
// detection below is always there, so a build without MPI refuses to run as many copies that would
// all write the same file.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attnprobe/report/run_info.h"
#include "attnprobe/sweep/runner.h"
#include "attnprobe/sweep/sweep_run.h"

namespace attnprobe {

/// This process's place in an MPI launch, read from the launcher's environment.
struct MpiLaunch {
  int rank = 0, size = 1;
  std::string variable;  ///< the variable that told (e.g. OMPI_COMM_WORLD_SIZE), for messages
};

/// Set when a launcher started this process: OpenMPI (OMPI_COMM_WORLD_SIZE/RANK), PMIx
/// (PMIX_RANK with OMPI/PMI sizes), MPICH/Intel MPI/Slurm PMI (PMI_SIZE/PMI_RANK), MVAPICH
/// (MV2_COMM_WORLD_SIZE/RANK). A Slurm job array task is not an MPI launch (no PMI size > 1).
std::optional<MpiLaunch> mpi_launch_from_environment();

/// Whether this build has the MPI runner (ATTNPROBE_MPI found an MPI).
bool mpi_compiled();

/// Why `sweep` must not run here, or "" when it may: a launch of more than one process in a build
/// without MPI would make every rank compute the whole grid into the same file.
std::string mpi_refusal(const std::optional<MpiLaunch>& launch, bool compiled);

struct MpiSweepResult {
  int rank = 0, ranks = 1;
  RunStats stats;  ///< rank 0: the whole run's; workers: their own units'
};

/// Runs the whole plan across the ranks of MPI_COMM_WORLD; collective (every rank calls it with the
/// same arguments). Initialises and finalises MPI. `costs` are unit_costs(dump, plan); `info` is
/// completed with the plan record; `options.threads` 0 means the node's cores divided among the
/// ranks on it; `options.progress` is called on rank 0. Throws what a single-process sweep throws
/// (on rank 0; workers stop quietly once rank 0 tells them to), and UsageError when built without MPI.
MpiSweepResult run_mpi_sweep(const Dump& dump, const SweepPlan& plan, const std::vector<int64_t>& costs,
                             const std::string& csv_path, OutputMode mode, RunOptions options, RunInfo info);

}  // namespace attnprobe
