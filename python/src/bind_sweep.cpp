// attnprobe._core's sweep (docs/python.md): the CLI's sweep set-up (sweep/sweep_setup.h) run on a thread
// of its own, so that Ctrl-C reaches it, with the sweep's custom Python estimators.
#include <cxxabi.h>
#include <pybind11/stl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "attnprobe/common/error.h"
#include "attnprobe/common/parallel.h"
#include "attnprobe/common/text.h"
#include "attnprobe/metrics/catalogue.h"
#include "attnprobe/records/csv.h"
#include "attnprobe/sweep/sweep_run.h"
#include "attnprobe/sweep/sweep_setup.h"
#include "bindings.h"
#include "custom_estimators.h"

namespace attnprobe::python {

namespace {

struct SweepArgs {
  std::string dump;
  DumpOptions options;
  std::vector<std::string> estimators;
  std::vector<int64_t> samples;
  std::string layers, heads, batch;
  std::vector<int64_t> lengths;
  int trials = 8;
  uint64_t seed = 0;
  int threads = 0;
  std::string device, reference, metrics;
  std::string output, mode;       ///< mode: create | resume | overwrite
  std::string shard;              ///< "I/N" as the CLI's --shard; "" for the whole plan
  std::string mask = "auto";      ///< auto | full | causal | window:W, as the CLI's --mask
  std::string queries = "all";    ///< all | last:W, a list, as the CLI's --queries
  std::string precision = "f32";  ///< f32 | bf16 | f16, a list, as the CLI's --precision
  std::vector<std::string> command_line;
};

// The stop flags of the sweeps running in this process: interpreter exit stops them and waits for them
// (stop_sweeps_at_exit, registered with atexit), so no sweep thread is inside the library when Python
// finalizes. Never destroyed: it is used at exit.
struct RunningSweeps {
  std::mutex mutex;
  std::condition_variable changed;
  std::set<std::atomic<bool>*> stops;
};
RunningSweeps& running_sweeps() {
  static auto* sweeps = new RunningSweeps;
  return *sweeps;
}

void stop_sweeps_at_exit() {
  py::gil_scoped_release release;  // the sweeps' custom estimators and their waiting threads need it
  RunningSweeps& sweeps = running_sweeps();
  std::unique_lock<std::mutex> lock(sweeps.mutex);
  for (std::atomic<bool>* stop : sweeps.stops) stop->store(true);
  sweeps.changed.wait_for(lock, std::chrono::seconds(60), [&] { return sweeps.stops.empty(); });
}

// Runs `work` on a thread of its own while this (the calling Python) thread waits, looking at
// Python's signals every 100 ms: a KeyboardInterrupt (Ctrl-C) or any exception a signal handler
// raises sets `stop`, the work stops after its running trials (RunOptions::stop_requested) and the
// Python exception is raised here. Without this a sweep could not be interrupted from Python: signal
// handlers run only on the main thread, between bytecodes, never while it sits in C++.
void run_interruptibly(const std::function<void()>& work, std::atomic<bool>& stop) {
  std::exception_ptr error;
  std::mutex mutex;
  std::condition_variable done_signal;
  bool done = false;
  RunningSweeps& sweeps = running_sweeps();
  {
    std::lock_guard<std::mutex> lock(sweeps.mutex);
    sweeps.stops.insert(&stop);
  }
  std::thread worker([&] {
    struct Unregister {
      RunningSweeps& sweeps;
      std::atomic<bool>* stop;
      ~Unregister() {
        std::lock_guard<std::mutex> lock(sweeps.mutex);
        sweeps.stops.erase(stop);
        sweeps.changed.notify_all();
      }
    } unregister{sweeps, &stop};
    try {
      work();
    } catch (abi::__forced_unwind&) {  // the thread is being ended (pthread_exit): let it end
      throw;
    } catch (...) {
      error = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(mutex);
    done = true;
    done_signal.notify_one();
  });
  // If this thread is unwound (Python 3.11 ends a daemon thread that reacquires the GIL during
  // finalization), the worker is stopped and joined first: a joinable std::thread would terminate().
  struct StopAndJoin {
    std::thread& worker;
    std::atomic<bool>& stop;
    ~StopAndJoin() {
      if (!worker.joinable()) return;
      stop.store(true);
      worker.join();
    }
  } stop_and_join{worker, stop};
  bool signalled = false;
  for (bool finished = false; !finished;) {
    // The GIL is given up and taken back by plain calls, not by gil_scoped_release: Python 3.11 ends a
    // daemon thread that takes it back during finalization with a forced unwind, which leaving a
    // destructor turns into terminate(); from a plain call it unwinds through StopAndJoin.
    PyThreadState* state = PyEval_SaveThread();
    {
      std::unique_lock<std::mutex> lock(mutex);
      finished = done_signal.wait_for(lock, std::chrono::milliseconds(100), [&] { return done; });
    }
    if (finished) worker.join();  // without the GIL: a custom estimator may hold it until the worker ends
    PyEval_RestoreThread(state);
    if (!finished && !signalled && PyErr_CheckSignals() != 0) {  // the handler raised: stop, then raise it
      signalled = true;
      stop.store(true);
    }
  }
  if (signalled) {
    if (error) {
      try {
        std::rethrow_exception(error);
      } catch (const Interrupted&) {  // the expected end; the Python exception below says why
      }
    }
    throw py::error_already_set();
  }
  if (error) std::rethrow_exception(error);
}

// The library's sweep options from the Python layer's (checked and coerced there).
SweepOptions sweep_options(const SweepArgs& a) {
  SweepOptions o;
  o.request.estimators = a.estimators;
  o.request.samples = a.samples;
  o.request.layers = a.layers;
  o.request.heads = a.heads;
  o.request.batch = a.batch;
  o.request.lengths = a.lengths;
  o.request.trials = a.trials;
  o.request.seed = a.seed;
  o.request.reference = a.reference;
  o.request.metrics = parse_metrics(a.metrics, &o.request.recall_k);
  o.request.mask = a.mask;
  o.request.queries = parse_query_rows_list(a.queries, "queries");
  o.request.precisions = parse_precisions(a.precision);
  if (!a.shard.empty()) o.shard = ShardSpec::parse(a.shard);
  o.threads = a.threads;
  o.device = a.device;
  o.command_line = a.command_line;
  return o;
}

// Runs a sweep; returns the trial CSV text when there is no output file (else None: the caller
// reads the file, which holds the rows kept by a resume too). `custom`: name → (wrapper, [(key, [value
// text, ...]), ...], samples knob or "", deterministic), as the Python layer checked and printed them.
py::object sweep(const SweepArgs& a, const py::dict& custom) {
  CustomTable table;
  for (auto [key, item] : custom) {
    const auto name = py::cast<std::string>(key);
    const auto entry = py::cast<py::tuple>(item);
    const CustomDeclaration declared{
        .params = py::cast<std::vector<std::pair<std::string, std::vector<std::string>>>>(entry[1]),
        .samples_knob = py::cast<std::string>(entry[2]),
        .deterministic = py::cast<bool>(entry[3])};
    register_custom(table, name, declared);
    table.wrappers[name] = entry[0].ptr();
  }
  std::string text;
  std::atomic<bool> stop{false};
  run_interruptibly(
      [&] {
        const CustomScope scope(table);
        Dump dump = Dump::open(a.dump, a.options);
        SweepSetup setup = set_up_sweep(std::move(dump), sweep_options(a));
        setup.run.stop_requested = [&stop] { return stop.load(std::memory_order_relaxed); };
        if (a.output.empty()) {
          std::vector<TrialRow> rows;
          run_sweep(setup.dump, setup.part.plan, setup.run,
                    [&](const std::vector<TrialRow>& slice) { rows.insert(rows.end(), slice.begin(), slice.end()); });
          text = trial_csv_text(rows);
        } else {
          const OutputMode mode = a.mode == "resume"      ? OutputMode::kResume
                                  : a.mode == "overwrite" ? OutputMode::kOverwrite
                                                          : OutputMode::kCreate;
          SweepRun run(setup.dump, std::move(setup.part.plan), a.output, mode, setup.run, setup.info);
          run.run();
        }
      },
      stop);
  if (a.output.empty()) return py::str(text);
  return py::none();
}

}  // namespace

void bind_sweep(py::module_& m) {
  m.def("stop_sweeps_at_exit", &stop_sweeps_at_exit);
  py::class_<SweepArgs>(m, "SweepArgs")
      .def(py::init<>())
      .def_readwrite("dump", &SweepArgs::dump)
      .def_readwrite("options", &SweepArgs::options)
      .def_readwrite("estimators", &SweepArgs::estimators)
      .def_readwrite("samples", &SweepArgs::samples)
      .def_readwrite("layers", &SweepArgs::layers)
      .def_readwrite("heads", &SweepArgs::heads)
      .def_readwrite("batch", &SweepArgs::batch)
      .def_readwrite("lengths", &SweepArgs::lengths)
      .def_readwrite("trials", &SweepArgs::trials)
      .def_readwrite("seed", &SweepArgs::seed)
      .def_readwrite("threads", &SweepArgs::threads)
      .def_readwrite("device", &SweepArgs::device)
      .def_readwrite("reference", &SweepArgs::reference)
      .def_readwrite("metrics", &SweepArgs::metrics)
      .def_readwrite("output", &SweepArgs::output)
      .def_readwrite("mode", &SweepArgs::mode)
      .def_readwrite("shard", &SweepArgs::shard)
      .def_readwrite("mask", &SweepArgs::mask)
      .def_readwrite("queries", &SweepArgs::queries)
      .def_readwrite("precision", &SweepArgs::precision)
      .def_readwrite("command_line", &SweepArgs::command_line);
  m.def("sweep", &sweep);
  m.def("hardware_threads", &hardware_threads);
  m.def("parse_int_list", [](const std::string& text, const std::string& what) { return parse_int_list(text, what); });
}

}  // namespace attnprobe::python
