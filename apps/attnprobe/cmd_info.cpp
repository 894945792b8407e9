#include <fmt/format.h>

#include <cmath>

#include "attnprobe/common/error.h"
#include "attnprobe/common/text.h"
#include "attnprobe/exact/exact_attention.h"
#include "attnprobe/report/table.h"
#include "commands.h"

namespace attnprobe::cli {

namespace {

struct InfoOptions {
  std::string path;
  DumpOptions dump;
  bool check = true;
  bool entropy = false;
};

// Mean over queries of the entropy (nats) of the softmax row: ln n for uniform attention.
double mean_attention_entropy(const HeadView& view) {
  double total = 0;
  for (int64_t i = 0; i < view.n(); ++i) {
    Eigen::RowVectorXd logits = view.scale * (view.q.row(i) * view.k.transpose());
    logits.array() -= logits.maxCoeff();
    const double z = logits.array().exp().sum();
    const Eigen::RowVectorXd prob = logits.array().exp() / z;
    total += -(prob.array() * (logits.array() - std::log(z))).sum();
  }
  return total / view.n();
}

int run_info(const InfoOptions& o) {
  const Dump dump = Dump::open(o.path, o.dump);
  fmt::print("dump: {}\n", o.path);
  for (const char* attr : {"model", "source", "created_by"}) {
    const std::string value = dump.root_attribute(attr);
    if (!value.empty()) fmt::print("{}: {}\n", attr, value);
  }
  fmt::print("layers: {}\n\n", dump.layers().size());
  std::vector<std::vector<std::string>> table = {
      {"layer", "group", "batch", "heads", "tokens", "p", "pv", "dtype", "gzip", "scale", "causal", "lengths"}};
  for (const LayerInfo& l : dump.layers()) {
    std::string lengths = l.has_lengths ? fmt::format("{}", fmt::join(l.lengths, ",")) : "all full";
    if (lengths.size() > 40) lengths = lengths.substr(0, 37) + "...";
    table.push_back({std::to_string(l.number), l.name, std::to_string(l.batch), std::to_string(l.heads),
                     std::to_string(l.tokens), std::to_string(l.dim), std::to_string(l.value_dim), l.dtype,
                     l.compressed ? "yes" : "no",
                     fmt::format("{:.6g}{}", l.scale, l.scale_from_file ? "" : " (1/sqrt(p))"),
                     l.causal ? std::to_string(*l.causal) : "-", lengths});
  }
  fmt::print("{}", format_table(table));
  if (std::any_of(dump.layers().begin(), dump.layers().end(), [](const LayerInfo& l) { return l.causal.value_or(0); }))
    fmt::print("note: causal=1 is informational; attnprobe always measures full (unmasked) attention.\n");
  if (!o.check) return 0;

  // Read every slice in full: values are checked for NaN/Inf by the reader, zero-norm rows counted.
  int64_t slices = 0, zero_q = 0, zero_k = 0;
  std::vector<std::vector<std::string>> entropy_table = {{"layer", "head", "mean entropy (nats)", "uniform ln(n)"}};
  for (const LayerInfo& l : dump.layers()) {
    for (int h = 0; h < l.heads; ++h) {
      double entropy = 0;
      int64_t mean_n = 0;
      for (int b = 0; b < l.batch; ++b) {
        const HeadView view = dump.read_slice(l.number, h, b, l.lengths[b]);
        ++slices;
        zero_q += (view.q.rowwise().squaredNorm().array() == 0).count();
        zero_k += (view.k.rowwise().squaredNorm().array() == 0).count();
        if (o.entropy) {
          entropy += mean_attention_entropy(view);
          mean_n += view.n();
        }
      }
      if (o.entropy)
        entropy_table.push_back({std::to_string(l.number), std::to_string(h), fmt::format("{:.3f}", entropy / l.batch),
                                 fmt::format("{:.3f}", std::log(static_cast<double>(mean_n) / l.batch))});
    }
  }
  fmt::print("\ncheck: read {} slices: all values finite.\n", slices);
  if (zero_q || zero_k)
    fmt::print(
        "warning: {} query and {} key rows have zero norm; YOSO normalises rows, so those rows hash to a "
        "fixed code.\n",
        zero_q, zero_k);
  if (o.entropy) fmt::print("\n{}", format_table(entropy_table));
  return 0;
}

}  // namespace

Action add_info(CLI::App& app) {
  auto o = std::make_shared<InfoOptions>();
  app.add_option("dump", o->path, "the HDF5 dump")->required();
  app.add_flag("!--no-check", o->check, "only print the structure; do not read every slice to check values");
  app.add_flag("--entropy", o->entropy,
               "also print the mean attention entropy per layer and head (ln n = uniform; lower = more peaked)");
  add_dump_options(app, o->dump);
  app.footer(
      "Example:\n  attnprobe info data/synth-demo.h5 --entropy\n\n"
      "The layout (DESIGN.md section 2): /layer_NN/q, k [B,H,N,P] and v [B,H,N,Pv] (float16/32/64, gzip or not); "
      "optional layer attributes scale (default 1/sqrt(P)) and causal; optional /layer_NN/lengths [B] with the valid "
      "tokens of each batch item. A length L < N means the first L tokens.");
  return [o] { return run_info(*o); };
}

}  // namespace attnprobe::cli
