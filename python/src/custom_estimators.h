#pragma once
// Custom estimators (sweep(custom=...), docs/python.md): each name is registered once as estimator
// `py:NAME` (family "python") whose instances call a Python callable, so the one trial runner runs them
// beside the built-ins with the same cases, keys, references and metrics. Which callable a `py:NAME`
// instance calls is decided per sweep through a thread-local table set by the sweeping thread
// (run_sweep builds its estimators on that thread), so concurrent sweeps do not see each other's.
#include <pybind11/pybind11.h>

#include <map>
#include <mutex>
#include <string>

namespace attnprobe::python {

// The custom estimators of one sweep: name → the Python wrapper (borrowed: the sweep's dict owns it
// for the sweep's whole duration), and a lock that lets one of them run at a time, so a function that
// seeds a global generator (torch.manual_seed) cannot be interleaved with another trial's call.
// Lock order: `calls` first, then the GIL (a thread never waits for `calls` while holding the GIL).
struct CustomTable {
  std::map<std::string, PyObject*> wrappers;
  std::mutex calls;
};

constexpr const char* kCustomPrefix = "py:";

/// Registers estimator `py:NAME` unless it is registered already; UsageError for a name a spec cannot hold.
void register_custom(const std::string& name);

/// While it lives, the `py:NAME` estimators this thread makes call `table`'s wrappers.
class CustomScope {
 public:
  explicit CustomScope(CustomTable& table);
  ~CustomScope();
  CustomScope(const CustomScope&) = delete;
  CustomScope& operator=(const CustomScope&) = delete;
};

}  // namespace attnprobe::python
