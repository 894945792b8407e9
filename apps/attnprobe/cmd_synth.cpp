#include <fmt/format.h>

#include "attnprobe/common/error.h"
#include "attnprobe/common/text.h"
#include "attnprobe/synth/synthetic_dump.h"
#include "commands.h"

namespace attnprobe::cli {

namespace {
struct SynthCommandOptions {
  SynthOptions synth;
  std::string output, dtype = "float32", temperatures = "0.1,1", valid_lengths;
  int gzip = 4;
};
}  // namespace

Action add_synth(CLI::App& app) {
  auto o = std::make_shared<SynthCommandOptions>();
  SynthOptions& s = o->synth;
  app.add_option("-o,--output", o->output, "the dump to write (overwritten)")->required();
  app.add_option("--layers", s.layers, "layers")->capture_default_str()->check(kAtLeastOne);
  app.add_option("--heads", s.heads, "heads per layer")->capture_default_str()->check(kAtLeastOne);
  app.add_option("--kv-heads", s.kv_heads,
                 "grouped-query K/V: this many kv heads, dividing --heads (query head h reads kv head "
                 "h/(heads/kv-heads), which holds the keys and values of its group's first query head); default: "
                 "--heads")
      ->check(kAtLeastOne);
  app.add_option("--batch", s.batch, "batch items")->capture_default_str()->check(kAtLeastOne);
  app.add_option("--tokens", s.tokens, "tokens per item (N)")->capture_default_str()->check(kAtLeastOne);
  app.add_option("--dim", s.dim, "head dim p of queries and keys")->capture_default_str()->check(kAtLeastOne);
  app.add_option("--value-dim", s.value_dim, "head dim of values (0: same as --dim)")->capture_default_str();
  app.add_option("--clusters", s.clusters, "clusters of tokens")->capture_default_str()->check(kAtLeastOne);
  app.add_option("--temperatures", o->temperatures,
                 "temperature per layer, cycled: same-cluster logits are about 1/T, others about 0, so 0.05 is very "
                 "peaked and 5 nearly uniform")
      ->capture_default_str();
  app.add_option("--spread", s.spread, "within-cluster noise (0 = all tokens of a cluster identical)")
      ->capture_default_str();
  app.add_option("--valid-lengths", o->valid_lengths, "valid tokens per batch item (writes a lengths dataset)");
  app.add_option("--seed", s.seed, "seed")->capture_default_str();
  app.add_option("--rope-base", s.rope_base,
                 "write rotary frequencies base^(-2f/p) per layer (rope_inv_freq, rope_layout = half) for "
                 "expected(stats=rope); the queries and keys are not rotated by them (0: none)")
      ->capture_default_str();
  app.add_option("--dtype", o->dtype, "float16, float32 or float64")->capture_default_str();
  app.add_option("--gzip", o->gzip, "gzip level 0..9 (0: uncompressed, contiguous)")
      ->capture_default_str()
      ->check(CLI::Range(0, 9));
  app.footer(
      "Example:\n  attnprobe synth -o data/synth-demo.h5 --layers 2 --heads 2 --tokens 1024 --temperatures 0.1,1\n\n"
      "Generator: tokens fall into clusters; queries and keys are noisy unit cluster directions scaled so that "
      "scale*q.k = cos/T; values are cluster means plus noise. Attention of a query concentrates on its cluster when T "
      "is small. The file is a pure function of the options (same bytes for the same command).");
  return [o] {
    SynthOptions options = o->synth;
    options.temperatures.clear();
    for (const std::string& t : split(o->temperatures, ',')) {
      double v;
      if (!parse_real(t, v)) throw UsageError(fmt::format("--temperatures: '{}' is not a number", t));
      options.temperatures.push_back(v);
    }
    if (!o->valid_lengths.empty()) options.lengths = parse_int_list(o->valid_lengths, "--valid-lengths");
    options.type = parse_stored_type(o->dtype);
    write_dump(o->output, make_synthetic_dump(options), DumpWriteOptions{options.type, o->gzip});
    fmt::print(stderr, "wrote {}: {} layers x {} heads x {} items x {} tokens, p = {}, {}\n", o->output, options.layers,
               options.heads, options.batch, options.tokens, options.dim, o->dtype);
    return 0;
  };
}

}  // namespace attnprobe::cli
