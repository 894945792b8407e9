#include "stop_signal.h"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <utility>

namespace attnprobe::cli {

namespace {

std::atomic<bool> stop_flag{false};
static_assert(std::atomic<bool>::is_always_lock_free, "the signal handler may only touch a lock-free atomic");
struct sigaction previous_int, previous_term;

extern "C" void on_stop_signal(int) {
  stop_flag.store(true);
  // Only async-signal-safe calls here: write(2), no formatting. The leading newline ends a progress bar's line.
  constexpr char kMessage[] =
      "\nattnprobe: stopping: the trials now running finish and are written (a second Ctrl-C stops at once)\n";
  [[maybe_unused]] const ssize_t ignored = write(STDERR_FILENO, kMessage, sizeof kMessage - 1);
}

}  // namespace

StopOnSignal::StopOnSignal() {
  stop_flag.store(false);
  struct sigaction action = {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESETHAND | SA_RESTART;  // the second signal gets the default action: the process ends
  for (auto [signal, previous] : {std::pair{SIGINT, &previous_int}, std::pair{SIGTERM, &previous_term}}) {
    sigaction(signal, &action, previous);
    // A signal ignored when we started stays ignored: a shell script's background job ignores SIGINT
    // so that Ctrl-C reaches the foreground only, and nohup-like wrappers rely on the same rule.
    if (previous->sa_handler == SIG_IGN) sigaction(signal, previous, nullptr);
  }
}

StopOnSignal::~StopOnSignal() {
  sigaction(SIGINT, &previous_int, nullptr);
  sigaction(SIGTERM, &previous_term, nullptr);
}

bool StopOnSignal::requested() { return stop_flag.load(std::memory_order_relaxed); }

}  // namespace attnprobe::cli
