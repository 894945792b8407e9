#include "stop_signal.h"

#include <unistd.h>

#include <atomic>
#include <csignal>

namespace attnprobe::cli {

namespace {

std::atomic<bool> stop_flag{false};
static_assert(std::atomic<bool>::is_always_lock_free, "the signal handler may only touch a lock-free atomic");
struct sigaction previous_int, previous_term;
// Which of the two carry our handler (a signal ignored at start does not); written before installing.
volatile std::sig_atomic_t handling_int = 0, handling_term = 0;

extern "C" void on_stop_signal(int) {
  stop_flag.store(true);
  // Any second signal, of either kind (Ctrl-C, then a scheduler's SIGTERM), ends the process: both go back
  // to the default action now (signal(2) is async-signal-safe; SA_RESETHAND would reset only this one).
  if (handling_int) std::signal(SIGINT, SIG_DFL);
  if (handling_term) std::signal(SIGTERM, SIG_DFL);
  // Only async-signal-safe calls here: write(2), no formatting. The leading newline ends a progress bar's line.
  constexpr char kMessage[] =
      "\nattnprobe: stopping: the trials now running finish and are written (a second signal stops at once)\n";
  [[maybe_unused]] const ssize_t ignored = write(STDERR_FILENO, kMessage, sizeof kMessage - 1);
}

}  // namespace

StopOnSignal::StopOnSignal() {
  stop_flag.store(false);
  // A signal ignored when we started stays ignored: a shell script's background job ignores SIGINT so
  // that Ctrl-C reaches the foreground only, and nohup-like wrappers rely on the same rule.
  sigaction(SIGINT, nullptr, &previous_int);
  sigaction(SIGTERM, nullptr, &previous_term);
  handling_int = previous_int.sa_handler != SIG_IGN;
  handling_term = previous_term.sa_handler != SIG_IGN;
  struct sigaction action = {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  sigaddset(&action.sa_mask, SIGINT);  // one handler run at a time
  sigaddset(&action.sa_mask, SIGTERM);
  action.sa_flags = SA_RESTART;
  if (handling_int) sigaction(SIGINT, &action, nullptr);
  if (handling_term) sigaction(SIGTERM, &action, nullptr);
}

StopOnSignal::~StopOnSignal() {
  sigaction(SIGINT, &previous_int, nullptr);
  sigaction(SIGTERM, &previous_term, nullptr);
}

bool StopOnSignal::requested() { return stop_flag.load(std::memory_order_relaxed); }

}  // namespace attnprobe::cli
