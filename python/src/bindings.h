#pragma once
// The parts of attnprobe._core, one file each; module.cpp's PYBIND11_MODULE calls them in turn
// (pybind11's advice for a module of many functions). Each converts its arguments and calls the library.
#include <pybind11/pybind11.h>

namespace attnprobe::python {

namespace py = pybind11;

void bind_registry(py::module_& m);  ///< bind_registry.cpp: estimators(), device_status, canonical
void bind_slices(py::module_& m);    ///< bind_slices.cpp: load(), Slice
void bind_estimate(py::module_& m);  ///< bind_estimate.cpp: exact, estimate, reference, metrics, keys
void bind_sweep(py::module_& m);     ///< bind_sweep.cpp: sweep() and its custom estimators
void bind_records(py::module_& m);   ///< bind_records.cpp: rows of DataFrames, summarize, check

}  // namespace attnprobe::python
