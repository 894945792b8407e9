#pragma once
// Custom estimators (sweep(custom=...), docs/python.md): each name is registered as estimator `py:NAME`
// (family "python") whose instances call a Python callable, so the one trial runner runs them beside the
// built-ins with the same cases, keys, references and metrics. A sweep declares each name's keys (with the
// values of its grid), samples knob and determinism; a later sweep may declare the name again otherwise, and
// the registry's definition is then replaced (never while a running sweep uses the old one). Which callable a
// `py:NAME` instance calls is decided per sweep through a thread-local table set by the sweeping thread
// (run_sweep builds its estimators on that thread), so concurrent sweeps do not see each other's.
#include <pybind11/pybind11.h>

#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace attnprobe::python {

// The custom estimators of one sweep: name → the Python wrapper (borrowed: the sweep's dict owns it
// for the sweep's whole duration), and a lock that lets one of them run at a time, so a function that
// seeds a global generator (torch.manual_seed) cannot be interleaved with another trial's call.
// Lock order: `calls` first, then the GIL (a thread never waits for `calls` while holding the GIL).
// `held`: the names this sweep declared, released (for redeclaration) when the table goes.
struct CustomTable {
  std::map<std::string, PyObject*> wrappers;
  std::mutex calls;
  std::vector<std::string> held;
  CustomTable() = default;
  CustomTable(const CustomTable&) = delete;
  CustomTable& operator=(const CustomTable&) = delete;
  ~CustomTable();
};

/// How a sweep declares one custom estimator (the Python layer has checked and printed it).
struct CustomDeclaration {
  /// Its keys in spec order, each with the canonical texts of its values (the first is the default). The samples
  /// knob is an integer key (any value >= 1, as `samples=` may set it); the others take their listed values only.
  std::vector<std::pair<std::string, std::vector<std::string>>> params;
  std::string samples_knob;    ///< a key of `params`, or "" for none
  bool deterministic = false;  ///< draws nothing: one trial per case, like the built-in deterministic estimators
};

constexpr const char* kCustomPrefix = "py:";

/// Registers estimator `py:NAME` as `declared` (replacing an earlier, different declaration) and records in `table`
/// that this sweep uses it. UsageError for a name a spec cannot hold, or for a declaration that differs from the
/// one a sweep running now uses.
void register_custom(CustomTable& table, const std::string& name, const CustomDeclaration& declared);

/// While it lives, the `py:NAME` estimators this thread makes call `table`'s wrappers.
class CustomScope {
 public:
  explicit CustomScope(CustomTable& table);
  ~CustomScope();
  CustomScope(const CustomScope&) = delete;
  CustomScope& operator=(const CustomScope&) = delete;
};

}  // namespace attnprobe::python
