#pragma once
// Ctrl-C (SIGINT) and SIGTERM during a sweep. The first one asks the run to stop: no further trial
// starts, the trials already running finish and are written, run.json records the interruption, and
// the command exits 130; `sweep --resume` then computes only what is missing. A second signal, of
// either kind, ends the process at once, as it would without this handler.
// A signal that was ignored when attnprobe started (a background job of a shell script, nohup) stays
// ignored. Installed only around a single-process sweep: `eval` keeps its rows in memory until the end, and
// under mpirun the launcher owns the signals.

namespace attnprobe::cli {

class StopOnSignal {
 public:
  StopOnSignal();   ///< installs the handlers for SIGINT and SIGTERM
  ~StopOnSignal();  ///< restores the previous handlers
  StopOnSignal(const StopOnSignal&) = delete;
  StopOnSignal& operator=(const StopOnSignal&) = delete;

  /// True once a signal arrived; safe to call from any thread (RunOptions::stop_requested).
  static bool requested();
};

}  // namespace attnprobe::cli
