// attnprobe._core's slices (docs/python.md): load() reads one slice of a dump through the CLI's reader,
// and attnprobe.Slice keeps q, k, v converted once for many calls on them.
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "arrays.h"
#include "attnprobe/common/error.h"
#include "attnprobe/io/dump.h"
#include "bindings.h"

namespace attnprobe::python {

namespace {

DumpOptions dump_options(const std::string& q_path, const std::string& k_path, const std::string& v_path,
                         const std::string& layout, int num_heads) {
  return DumpOptions{q_path, k_path, v_path, layout, num_heads};
}

py::object load(const std::string& path, int layer, int head, int batch, std::optional<int64_t> length,
                const DumpOptions& options, bool as_slice) {
  HeadView view;
  std::optional<int> causal;
  std::optional<int64_t> window;
  bool cross = false;
  {
    py::gil_scoped_release release;
    const Dump dump = Dump::open(path, options);
    const LayerInfo& info = dump.layer(layer);
    require_input(head >= 0 && head < info.heads, "head {} does not exist in layer {} of '{}' (valid: 0..{})", head,
                  layer, path, info.heads - 1);
    require_input(batch >= 0 && batch < info.batch, "batch item {} does not exist in layer {} of '{}' (valid: 0..{})",
                  batch, layer, path, info.batch - 1);
    const int64_t valid = info.lengths[batch];
    const int64_t n = length.value_or(valid);
    require_input(n >= 1 && n <= valid,
                  "length {} is not in 1..{} (the valid tokens of layer {} batch item {} of '{}')", n, valid, layer,
                  batch, path);
    view = dump.read_slice(layer, head, batch, n);
    causal = info.causal;
    window = info.window;
    cross = info.cross;
  }
  if (as_slice) {  // with the mask `--mask auto` reads from the layer's attributes
    auto slice = std::make_unique<Slice>();
    if (causal.value_or(0) != 0) {
      view.mask = window ? Mask::kWindow : Mask::kCausal;
      view.window = window.value_or(0);
    }
    slice->cross = cross;
    slice->view = std::move(view);
    return py::cast(std::move(slice));
  }
  // (q, k, v) alone would silently measure another attention than the model's.
  require_usage(!view.shaping.any(),
                "layer {} of '{}' applies {} to its scores, which (q, k, v, scale, causal) cannot carry: use "
                "load(..., as_slice=True), a Slice that exact() and estimate() take with its shaping",
                layer, path, view.shaping.description());
  return py::make_tuple(to_numpy(std::move(view.q)), to_numpy(std::move(view.k)), to_numpy(std::move(view.v)),
                        view.scale, causal.value_or(0) != 0);
}

}  // namespace

void bind_slices(py::module_& m) {
  m.def("dump_options", &dump_options);
  py::class_<DumpOptions>(m, "DumpOptions");
  m.def("load", &load);
  py::class_<Slice>(m, "Slice")
      .def(py::init([](py::array q, py::array k, py::array v, std::optional<double> scale, const std::string& mask,
                       std::optional<std::vector<int64_t>> positions, bool cross, std::optional<py::array> bias,
                       double softcap, double alibi_slope, bool bias_first,
                       std::optional<std::vector<double>> rope_inv_freq) {
             const QKV in = prepared(q, k, v);
             const QueryPlacement placement =
                 parse_placement(mask, std::move(positions), cross, bias, softcap, alibi_slope, bias_first);
             auto slice = std::make_unique<Slice>();
             slice->cross = cross;
             py::gil_scoped_release release;
             fill_view(slice->view, in, scale, placement, SliceId{}, nullptr);
             if (rope_inv_freq) {  // as a dump's layer gives them (docs/dumps.md, "Rotary frequencies")
               require_usage(!cross, "rope_inv_freq: cross-attention queries have no positions to rotate by");
               const std::string problem = rotary_frequencies_problem(*rope_inv_freq, slice->view.p());
               require_usage(problem.empty(), "rope_inv_freq: {}", problem);
               slice->view.rope_inv_freq = std::make_shared<const std::vector<double>>(std::move(*rope_inv_freq));
             }
             return slice;
           }),
           py::arg("q"), py::arg("k"), py::arg("v"), py::arg("scale") = py::none(), py::arg("mask") = "full",
           py::arg("q_positions") = py::none(), py::arg("cross") = false, py::arg("bias") = py::none(),
           py::arg("softcap") = 0.0, py::arg("alibi_slope") = 0.0, py::arg("bias_before_softcap") = false,
           py::arg("rope_inv_freq") = py::none())
      .def_property_readonly("softcap", [](const Slice& s) { return s.view.shaping.softcap; })
      .def_property_readonly("alibi_slope", [](const Slice& s) { return s.view.shaping.alibi_slope; })
      .def_property_readonly("bias_before_softcap", [](const Slice& s) { return s.view.shaping.bias_before_softcap; })
      .def_property_readonly("bias",
                             [](const Slice& s) -> py::object {
                               if (!s.view.shaping.bias) return py::none();
                               return to_numpy(MatrixD(*s.view.shaping.bias));
                             })
      .def_property_readonly("rope_inv_freq",
                             [](const Slice& s) -> py::object {
                               if (!s.view.rope_inv_freq) return py::none();
                               const std::vector<double>& f = *s.view.rope_inv_freq;
                               return py::array_t<double>(static_cast<py::ssize_t>(f.size()), f.data());
                             })
      .def_property_readonly("scale", [](const Slice& s) { return s.view.scale; })
      .def_property_readonly("mask", [](const Slice& s) { return mask_text(s.view.mask, s.view.window); })
      .def_property_readonly("causal", [](const Slice& s) { return s.view.mask == Mask::kCausal; })
      .def_property_readonly("cross", [](const Slice& s) { return s.cross; })
      .def_property_readonly("n", [](const Slice& s) { return s.view.n(); })
      .def_property_readonly("keys", [](const Slice& s) { return s.view.keys(); })
      .def_property_readonly("q_positions",
                             [](const Slice& s) -> py::object {
                               if (s.cross) return py::none();
                               std::vector<int64_t> at(s.view.n());
                               for (int64_t i = 0; i < s.view.n(); ++i) at[i] = s.view.position(i);
                               return py::array_t<int64_t>(static_cast<py::ssize_t>(at.size()), at.data());
                             })
      .def_property_readonly("p", [](const Slice& s) { return s.view.p(); })
      .def_property_readonly("pv", [](const Slice& s) { return s.view.pv(); })
      .def_property_readonly("q", [](const Slice& s) { return to_numpy(MatrixD(s.view.q)); })
      .def_property_readonly("k", [](const Slice& s) { return to_numpy(MatrixD(s.view.k)); })
      .def_property_readonly("v", [](const Slice& s) { return to_numpy(MatrixD(s.view.v)); });
}

}  // namespace attnprobe::python
