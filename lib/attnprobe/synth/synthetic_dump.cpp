#include "attnprobe/synth/synthetic_dump.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "attnprobe/common/error.h"
#include "attnprobe/common/matrix.h"
#include "attnprobe/common/text.h"
#include "attnprobe/rng/random_stream.h"
#include "attnprobe/version.h"

namespace attnprobe {

namespace {
// Purposes of the generator's draws (its own streams, keyed per layer and head).
enum : uint32_t { kCentre = 0, kValueCentre = 1, kCluster = 2, kQueryNoise = 3, kKeyNoise = 4, kValueNoise = 5 };
}  // namespace

DumpContents make_synthetic_dump(const SynthOptions& o) {
  if (o.layers < 1 || o.heads < 1 || o.batch < 1 || o.tokens < 1 || o.dim < 1 || o.clusters < 1)
    throw UsageError("synth: layers, heads, batch, tokens, dim and clusters must all be at least 1");
  const int kv_heads = o.kv_heads > 0 ? o.kv_heads : o.heads;
  require_usage(o.heads % kv_heads == 0, "synth: --kv-heads {} must divide --heads {}", kv_heads, o.heads);
  const int group = o.heads / kv_heads;
  if (o.temperatures.empty()) throw UsageError("synth: give at least one temperature");
  for (double t : o.temperatures)
    if (!(t > 0) || !std::isfinite(t)) throw UsageError(fmt::format("synth: temperature {} must be positive", t));
  if (!o.lengths.empty()) {
    if (static_cast<int>(o.lengths.size()) != o.batch)
      throw UsageError(fmt::format("synth: --valid-lengths needs one value per batch item ({})", o.batch));
    for (int64_t l : o.lengths)
      if (l < 1 || l > o.tokens) throw UsageError(fmt::format("synth: valid length {} outside 1..{}", l, o.tokens));
  }
  require_usage(std::isfinite(o.spread) && o.spread >= 0, "synth: --spread {} must be a finite number >= 0",
                format_real(o.spread));
  require_usage(o.rope_base == 0 || (std::isfinite(o.rope_base) && o.rope_base > 1 && o.dim % 2 == 0),
                "synth: --rope-base {} needs a finite base above 1 and an even --dim (one frequency per pair of "
                "channels), or 0 for none",
                format_real(o.rope_base));
  const int p = o.dim, pv = o.value_dim > 0 ? o.value_dim : o.dim;
  const double sqrt_p = std::sqrt(static_cast<double>(p));

  DumpContents contents;
  contents.attributes["model"] = "synthetic clusters";
  contents.attributes["source"] = fmt::format("attnprobe synth: seed={} clusters={} temperatures={} spread={}", o.seed,
                                              o.clusters, fmt::join(o.temperatures, ","), o.spread);
  contents.attributes["created_by"] = fmt::format("attnprobe {} synth", kVersion);
  if (o.rope_base > 0) contents.attributes["rope_layout"] = "half";

  for (int layer = 0; layer < o.layers; ++layer) {
    const double temperature = o.temperatures[layer % o.temperatures.size()];
    const double amplitude = std::sqrt(sqrt_p / temperature);
    DumpLayer out;
    out.name = fmt::format("layer_{:02d}", layer);
    out.scale = 1.0 / sqrt_p;
    out.causal = 0;
    if (!o.lengths.empty()) out.lengths = o.lengths;
    if (o.rope_base > 0) {  // Hugging Face's default: 1 / base^(2f/p)
      DumpArray& frequencies = out.datasets["rope_inv_freq"];
      frequencies.shape = {static_cast<hsize_t>(p / 2)};
      for (int f = 0; f < p / 2; ++f)
        frequencies.values.push_back(std::pow(o.rope_base, -2.0 * f / static_cast<double>(p)));
    }
    const std::vector<hsize_t> shape = {static_cast<hsize_t>(o.batch), static_cast<hsize_t>(o.heads),
                                        static_cast<hsize_t>(o.tokens), static_cast<hsize_t>(p)};
    DumpArray& q = out.datasets["q"];
    DumpArray& k = out.datasets["k"];
    DumpArray& v = out.datasets["v"];
    q.shape = k.shape = shape;
    k.shape[1] = static_cast<hsize_t>(kv_heads);
    v.shape = {shape[0], static_cast<hsize_t>(kv_heads), shape[2], static_cast<hsize_t>(pv)};
    q.values.resize(o.batch * o.heads * o.tokens * p);
    k.values.resize(o.batch * kv_heads * o.tokens * p);
    v.values.resize(o.batch * kv_heads * o.tokens * pv);

    for (int head = 0; head < o.heads; ++head) {
      const RandomKey key = make_random_key(o.seed, fmt::format("synth;layer={};head={}", layer, head), 0);
      const RandomStream centres(key, Purpose::kGeneric);
      MatrixD mu(o.clusters, p), nu(o.clusters, pv);
      for (int c = 0; c < o.clusters; ++c) {
        centres.normals(c, kCentre, mu.row(c).data(), p);
        centres.normals(c, kValueCentre, nu.row(c).data(), pv);
        mu.row(c).normalize();
      }
      RowVectorD noise_q(p), noise_k(p), noise_v(pv);
      for (int b = 0; b < o.batch; ++b) {
        const uint32_t row_base = static_cast<uint32_t>(b * o.tokens);
        for (int64_t j = 0; j < o.tokens; ++j) {
          const uint32_t row = row_base + static_cast<uint32_t>(j);
          const uint32_t c = centres.index(o.clusters, row, 0, kCluster);
          centres.normals(row, kQueryNoise, noise_q.data(), p);
          centres.normals(row, kKeyNoise, noise_k.data(), p);
          centres.normals(row, kValueNoise, noise_v.data(), pv);
          const RowVectorD u = (mu.row(c) + o.spread / sqrt_p * noise_q).normalized() * amplitude;
          const RowVectorD w = (mu.row(c) + o.spread / sqrt_p * noise_k).normalized() * amplitude;
          const RowVectorD val = nu.row(c) + 0.5 * noise_v;
          const size_t base = ((static_cast<size_t>(b) * o.heads + head) * o.tokens + j);
          std::copy(u.data(), u.data() + p, q.values.begin() + base * p);
          if (head % group) continue;  // grouped K/V: kv head head/group keeps its group's first head's
          const size_t kv_base = ((static_cast<size_t>(b) * kv_heads + head / group) * o.tokens + j);
          std::copy(w.data(), w.data() + p, k.values.begin() + kv_base * p);
          std::copy(val.data(), val.data() + pv, v.values.begin() + kv_base * pv);
        }
      }
    }
    // What the stored type cannot hold would be written as inf (or NaN from inf − inf in the noise).
    const double largest = o.type == StoredType::kFloat16   ? 65504.0
                           : o.type == StoredType::kFloat32 ? static_cast<double>(std::numeric_limits<float>::max())
                                                            : std::numeric_limits<double>::max();
    for (const auto& [name, array] : out.datasets)
      for (double value : array.values)
        require_usage(std::isfinite(value) && std::abs(value) <= largest,
                      "synth: {} (temperature {}, --spread {}) gives {} the value {}, beyond what the dump's type "
                      "holds (largest {:g}). Use a larger temperature, a smaller --spread or a wider --dtype.",
                      out.name, format_real(temperature), format_real(o.spread), name, format_real(value), largest);
    contents.layers.push_back(std::move(out));
  }
  return contents;
}

}  // namespace attnprobe
