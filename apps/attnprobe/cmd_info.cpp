#include <fmt/format.h>

#include <cmath>

#include "attnprobe/common/error.h"
#include "attnprobe/common/text.h"
#include "attnprobe/diagnose/dump_inspection.h"
#include "attnprobe/diagnose/slice_diagnostics.h"
#include "attnprobe/estimators/registry.h"
#include "attnprobe/metrics/head_diagnostics.h"
#include "attnprobe/report/table.h"
#include "attnprobe/sweep/plan.h"
#include "commands.h"

namespace attnprobe::cli {

namespace {

// "N" for self-attention, "Nq/Nk" for a layer with its own query rows.
std::string tokens_text(const LayerInfo& l) {
  return l.own_queries() ? fmt::format("{}/{}", l.tokens, l.key_tokens) : std::to_string(l.tokens);
}

// The mask --mask auto chooses for the layer, from its causal, window and cross attributes.
std::string auto_mask_text(const LayerInfo& l) {
  if (l.cross) return "full (cross)";
  const MaskSpec mask = resolve_mask("auto", l);
  return mask_text(mask.mask, mask.window);
}

struct InfoOptions {
  std::string path;
  DumpOptions dump;
  bool check = true;
  bool entropy = false;
  bool diagnostics = false;
};

int run_info(const InfoOptions& o) {
  const Dump dump = Dump::open(o.path, o.dump);
  fmt::print("dump: {} ({})\n", o.path, dump.format());
  for (const char* attr : {"model", "source", "created_by"}) {
    const std::string value = dump.root_attribute(attr);
    if (!value.empty()) fmt::print("{}: {}\n", attr, value);
  }
  fmt::print("layers: {}\n\n", dump.layers().size());
  std::vector<std::vector<std::string>> table = {{"layer", "group", "batch", "heads", "kv heads", "tokens", "p", "pv",
                                                  "dtype", "gzip", "scale", "mask (auto)", "lengths"}};
  for (const LayerInfo& l : dump.layers()) {
    std::string lengths = l.has_lengths ? fmt::format("{}", fmt::join(l.lengths, ",")) : "all full";
    if (lengths.size() > 40) lengths = lengths.substr(0, 37) + "...";
    table.push_back(
        {std::to_string(l.number), l.name, std::to_string(l.batch), std::to_string(l.heads), std::to_string(l.kv_heads),
         tokens_text(l), std::to_string(l.dim), std::to_string(l.value_dim), l.dtype, l.compressed ? "yes" : "no",
         fmt::format("{:.6g}{}", l.scale, l.scale_from_file ? "" : " (1/sqrt(p))"), auto_mask_text(l), lengths});
  }
  fmt::print("{}", format_table(table));
  if (std::any_of(dump.layers().begin(), dump.layers().end(), [](const LayerInfo& l) { return l.causal.value_or(0); }))
    fmt::print(
        "note: layers with causal=1 are measured under a causal mask by default (--mask auto); --mask full measures "
        "them bidirectionally.\n");
  if (std::any_of(dump.layers().begin(), dump.layers().end(), [](const LayerInfo& l) { return l.own_queries(); }))
    fmt::print(
        "note: tokens Nq/Nk: layers with fewer queries than keys store decode steps (queries at the last positions "
        "of the cache, or at layer_NN/q_positions); each case measures those rows against the whole cache "
        "(queries=dump in the CSV), only with estimators that have a decode form.\n");
  for (const LayerInfo& l : dump.layers())
    if (l.shaped())
      fmt::print(
          "note: layer {} applies {} to its scores (docs/dumps.md, \"Score shaping\"): its reference honours it, and "
          "only estimators that do too run on it ({}).\n",
          l.number, l.shaping(), join(estimators_where([](const Capabilities& can) { return can.shaping; }), ", "));
  if (!o.check) return 0;

  // Read every slice in full: values are checked for NaN/Inf by the reader, zero-norm rows counted.
  const DumpInspection inspection = inspect_dump(dump, o.entropy);
  fmt::print("\ncheck: read {} slices: all values finite.\n", inspection.slices);
  if (inspection.zero_query_rows || inspection.zero_key_rows)
    fmt::print(
        "warning: {} query and {} key rows have zero norm; YOSO normalises rows, so those rows hash to a "
        "fixed code.\n",
        inspection.zero_query_rows, inspection.zero_key_rows);
  if (o.entropy) {
    std::vector<std::vector<std::string>> table = {{"layer", "head", "mean entropy (nats)", "uniform ln(n)"}};
    for (const DumpInspection::Head& h : inspection.heads)
      table.push_back({std::to_string(h.layer), std::to_string(h.head), fmt::format("{:.3f}", h.mean_entropy),
                       fmt::format("{:.3f}", std::log(h.mean_tokens))});
    fmt::print("\n{}", format_table(table));
  }
  if (o.diagnostics) {
    std::vector<SliceRef> slices;
    for (const LayerInfo& l : dump.layers())
      for (int h = 0; h < l.heads; ++h)
        for (int b = 0; b < l.batch; ++b) slices.push_back(SliceRef{l.number, h, b, l.lengths[b]});
    const std::vector<DiagnosticRow> rows = diagnose_slices(dump, slices, 0);
    std::vector<std::vector<std::string>> table = {{"layer", "head", "batch", "n"}};
    for (const std::string& name : diagnostic_names()) table[0].push_back(name);
    for (size_t r = 0; r < rows.size(); r += diagnostic_names().size()) {
      table.push_back({rows[r].layer.text(), rows[r].head.text(), rows[r].batch.text(), rows[r].n.text()});
      for (size_t d = 0; d < diagnostic_names().size(); ++d)
        table.back().push_back(fmt::format("{:.4g}", rows[r + d].value));
    }
    fmt::print("\nhead diagnostics (attnprobe diagnose --help explains each):\n{}", format_table(table));
  }
  return 0;
}

}  // namespace

Action add_info(CLI::App& app) {
  auto o = std::make_shared<InfoOptions>();
  app.add_option("dump", o->path, "the dump: HDF5, safetensors or .npz (told apart by the file's first bytes)")
      ->required();
  app.add_flag("!--no-check", o->check, "only print the structure; do not read every slice to check values");
  app.add_flag("--diagnostics", o->diagnostics,
               "also print each slice's head diagnostics: entropy, 90% support, max logit, stable rank, mean "
               "attention distance, spread of q and k norms (O(n^2 p) per slice; `attnprobe diagnose` writes a CSV)");
  app.add_flag("--entropy", o->entropy,
               "also print the mean attention entropy per layer and head (ln n = uniform; lower = more peaked)");
  add_dump_options(app, o->dump);
  app.footer(
      "Example:\n  attnprobe info data/synth-demo.h5 --entropy\n\n"
      "The layout (docs/dumps.md): /layer_NN/q [B,H,N,P], k [B,Hkv,N,P] and v [B,Hkv,N,Pv] (float16/32/64, gzip or "
      "not); grouped-query attention: Hkv divides H and query head h reads kv head h/(H/Hkv); optional layer "
      "attributes scale (default 1/sqrt(P)), causal, window (with causal = 1: a sliding window of W keys) and cross "
      "(cross-attention); optional /layer_NN/lengths [B] with the valid tokens (keys) of each batch item, "
      "/layer_NN/dy [B,H,N,Pv] with real upstream gradients. A length L < N means the first L tokens.\n"
      "Decode dumps: q [B,H,Nq,P] with Nq < Nk (the last Nq queries with the whole cache of Nk keys; positions "
      "Nk-Nq+i, or /layer_NN/q_positions [Nq] or [B,Nq], strictly increasing).\n\n"
      "Containers, chosen by the file's first bytes: HDF5 (above); safetensors (tensors layer_NN.q, .k, .v, .lengths, "
      ".dy in BF16/F16/F32/F64, lengths I32/I64; __metadata__ strings model, source, layer_NN.scale, "
      "layer_NN.causal; memory-mapped); .npz (arrays layer_NN.q ... as '<f2'/'<f4'/'<f8', 0-d arrays "
      "layer_NN.scale and layer_NN.causal; stored or deflated). bfloat16 and float16 widen exactly. "
      "tools/dump_qkv.py --format hdf5|safetensors|npz writes all three.");
  return [o] { return run_info(*o); };
}

}  // namespace attnprobe::cli
