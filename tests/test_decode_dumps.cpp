// Dumps that store their own query rows (docs/dumps.md, "Queries ≠ keys"): q with fewer tokens than k and v in
// HDF5, safetensors and .npz, grouped-query K/V, positions bottom-right or from layer_NN/q_positions, the window
// and cross attributes; exact attention on them against a float64 loop written here from the definition; and
// every malformed combination refused with exit 2 or 3 naming the file and what to do.
#include <catch2/catch.hpp>

#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <random>

#include "attnprobe/common/error.h"
#include "attnprobe/exact/exact_attention.h"
#include "attnprobe/io/dump.h"
#include "attnprobe/io/dump_writer.h"
#include "attnprobe/records/csv.h"
#include "container_bytes.h"
#include "support.h"

namespace attnprobe {
namespace {

using test::npy_bytes;
using test::raw_bytes;
using test::safetensors_file;
using test::StTensor;
using test::zip_file;

// A decode layer: q [B, H, Nq, P], k and v [B, Hkv, Nk, P], float32 values drawn from a fixed seed.
struct DecodeData {
  int64_t batch = 2, heads = 4, kv_heads = 2, nq = 7, nk = 97, p = 50;
  std::vector<float> q, k, v;

  DecodeData(int64_t nq_, int64_t nk_, int64_t p_, uint64_t seed) : nq(nq_), nk(nk_), p(p_) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    auto draw = [&](int64_t count) {
      std::vector<float> out(static_cast<size_t>(count));
      for (float& x : out) x = normal(rng);
      return out;
    };
    q = draw(batch * heads * nq * p);
    k = draw(batch * kv_heads * nk * p);
    v = draw(batch * kv_heads * nk * p);
  }
  double q_at(int64_t b, int64_t h, int64_t i, int64_t c) const { return q[((b * heads + h) * nq + i) * p + c]; }
  double k_at(int64_t b, int64_t h, int64_t j, int64_t c) const { return k[((b * kv_heads + h) * nk + j) * p + c]; }
  double v_at(int64_t b, int64_t h, int64_t j, int64_t c) const { return v[((b * kv_heads + h) * nk + j) * p + c]; }
  std::vector<int64_t> q_shape() const { return {batch, heads, nq, p}; }
  std::vector<int64_t> kv_shape() const { return {batch, kv_heads, nk, p}; }
};

// Softmax attention by its definition, one row at a time in float64: query row i of head h at position
// position(b, i) attends to the keys [first, last] its mask leaves, of kv head h / (H / Hkv).
MatrixD loop_attention(const DecodeData& d, int64_t b, int64_t h, const std::function<int64_t(int64_t)>& position,
                       const std::string& mask, int64_t window) {
  const int64_t kv = h / (d.heads / d.kv_heads);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d.p));
  MatrixD out = MatrixD::Zero(d.nq, d.p);
  for (int64_t i = 0; i < d.nq; ++i) {
    const int64_t t = position(i);
    const int64_t last = mask == "full" ? d.nk - 1 : t;
    const int64_t first = mask == "window" ? std::max<int64_t>(0, t - window + 1) : 0;
    std::vector<double> logits;
    double top = -INFINITY;
    for (int64_t j = first; j <= last; ++j) {
      double dot = 0;
      for (int64_t c = 0; c < d.p; ++c) dot += d.q_at(b, h, i, c) * d.k_at(b, kv, j, c);
      logits.push_back(scale * dot);
      top = std::max(top, logits.back());
    }
    double total = 0;
    for (double& x : logits) total += (x = std::exp(x - top));
    for (int64_t j = first; j <= last; ++j)
      for (int64_t c = 0; c < d.p; ++c) out(i, c) += logits[j - first] / total * d.v_at(b, kv, j, c);
  }
  return out;
}

DumpArray array_of(const std::vector<float>& values, const std::vector<int64_t>& shape) {
  return DumpArray{std::vector<hsize_t>(shape.begin(), shape.end()), std::vector<double>(values.begin(), values.end())};
}

struct LayerAttributes {
  int causal = 1;
  int64_t window = 0;  // 0: none
  bool cross = false;
  std::vector<int64_t> positions;  // [Nq] for every item, or empty
};

std::string hdf5_dump(const std::string& name, const DecodeData& d, const LayerAttributes& a) {
  DumpLayer layer;
  layer.name = "layer_00";
  layer.datasets = {
      {"q", array_of(d.q, d.q_shape())}, {"k", array_of(d.k, d.kv_shape())}, {"v", array_of(d.v, d.kv_shape())}};
  if (a.causal) layer.causal = a.causal;
  if (a.window) layer.integer_attributes["window"] = a.window;
  if (a.cross) layer.integer_attributes["cross"] = 1;
  if (!a.positions.empty())
    layer.integer_datasets["q_positions"] = DumpArray{{static_cast<hsize_t>(a.positions.size())},
                                                      std::vector<double>(a.positions.begin(), a.positions.end())};
  DumpContents contents;
  contents.layers.push_back(layer);
  const std::string path = test::temp_path(name);
  write_dump(path, contents, {});
  return path;
}

std::string write_bytes(const std::string& name, const std::string& bytes) {
  const std::string path = test::temp_path(name);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  return path;
}

std::string safetensors_dump(const std::string& name, const DecodeData& d, const LayerAttributes& a) {
  std::vector<StTensor> tensors = {{"layer_00.q", "F32", d.q_shape(), raw_bytes(d.q)},
                                   {"layer_00.k", "F32", d.kv_shape(), raw_bytes(d.k)},
                                   {"layer_00.v", "F32", d.kv_shape(), raw_bytes(d.v)}};
  if (!a.positions.empty())
    tensors.push_back(
        {"layer_00.q_positions", "I64", {static_cast<int64_t>(a.positions.size())}, raw_bytes(a.positions)});
  std::map<std::string, std::string> metadata = {{"layer_00.causal", std::to_string(a.causal)}};
  if (a.window) metadata["layer_00.window"] = std::to_string(a.window);
  if (a.cross) metadata["layer_00.cross"] = "1";
  return write_bytes(name, safetensors_file(tensors, metadata));
}

std::string npz_dump(const std::string& name, const DecodeData& d, const LayerAttributes& a) {
  std::vector<std::pair<std::string, std::string>> entries = {
      {"layer_00.q.npy", npy_bytes("<f4", d.q_shape(), raw_bytes(d.q))},
      {"layer_00.k.npy", npy_bytes("<f4", d.kv_shape(), raw_bytes(d.k))},
      {"layer_00.v.npy", npy_bytes("<f4", d.kv_shape(), raw_bytes(d.v))},
      {"layer_00.causal.npy", npy_bytes("<i8", {}, raw_bytes(std::vector<int64_t>{a.causal}))}};
  if (a.window) entries.push_back({"layer_00.window.npy", npy_bytes("<i8", {}, raw_bytes(std::vector{a.window}))});
  if (a.cross) entries.push_back({"layer_00.cross.npy", npy_bytes("<i8", {}, raw_bytes(std::vector<int64_t>{1}))});
  if (!a.positions.empty())
    entries.push_back({"layer_00.q_positions.npy",
                       npy_bytes("<i8", {static_cast<int64_t>(a.positions.size())}, raw_bytes(a.positions))});
  return write_bytes(name, zip_file(entries, true));
}

// Every slice of the dump's layer 0 under its --mask auto: the exact float64 output within 1e-12 (relative
// to the output's largest entry) of the loop, and the float32 output within float32 rounding.
void check_exact(const std::string& path, const DecodeData& d, const LayerAttributes& a) {
  INFO(path);
  const Dump dump = Dump::open(path);
  const LayerInfo& info = dump.layer(0);
  CHECK(info.own_queries());
  CHECK(info.tokens == d.nq);
  CHECK(info.key_tokens == d.nk);
  const std::string mask = a.cross ? "full" : a.window ? "window" : a.causal ? "causal" : "full";
  for (int b = 0; b < d.batch; ++b)
    for (int h = 0; h < d.heads; ++h) {
      HeadView view = dump.read_slice(0, h, b, d.nk);
      view.mask = mask == "window" ? Mask::kWindow : mask == "causal" ? Mask::kCausal : Mask::kFull;
      view.window = a.window;
      const auto position = [&](int64_t i) { return a.positions.empty() ? d.nk - d.nq + i : a.positions[i]; };
      const MatrixD want = loop_attention(d, b, h, position, mask, a.window);
      const double size = want.cwiseAbs().maxCoeff();
      const MatrixD f64 = exact_attention_f64(view.q, view.k, view.v, view.scale, nullptr, view.geometry());
      // Observed ≤ 6.9e-15 of the largest entry over every file, slice and geometry (summation order only).
      CHECK((f64 - want).cwiseAbs().maxCoeff() <= 1e-12 * size);
      MatrixF f32;
      exact_attention_f32(view.qf, view.kf, view.vf, static_cast<float>(view.scale), f32, nullptr, view.geometry());
      // float32 rounding of sums of up to 4096 O(1) products: observed ≤ 1.1e-6 of the largest entry.
      CHECK((f32.cast<double>() - want).cwiseAbs().maxCoeff() <= 1e-5 * size);
    }
}

}  // namespace

TEST_CASE("decode dumps in HDF5, safetensors and .npz give exact attention by its definition", "[decode][dumps]") {
  const DecodeData d(7, 97, 50, 11);
  const std::vector<LayerAttributes> geometries = {
      {.causal = 1},                                            // bottom-right causal
      {.causal = 1, .window = 20},                              // sliding window
      {.causal = 1, .positions = {3, 10, 20, 40, 60, 80, 96}},  // explicit positions
      {.causal = 0},                                            // full: every key
  };
  for (size_t g = 0; g < geometries.size(); ++g) {
    const LayerAttributes& a = geometries[g];
    check_exact(hdf5_dump(fmt::format("decode-{}.h5", g), d, a), d, a);
    check_exact(safetensors_dump(fmt::format("decode-{}.safetensors", g), d, a), d, a);
    check_exact(npz_dump(fmt::format("decode-{}.npz", g), d, a), d, a);
  }
  // Cross-attention: more queries than keys, no positions.
  const DecodeData cross(7, 5, 16, 12);
  const LayerAttributes c{.causal = 0, .cross = true};
  check_exact(hdf5_dump("cross.h5", cross, c), cross, c);
  check_exact(safetensors_dump("cross.safetensors", cross, c), cross, c);
  check_exact(npz_dump("cross.npz", cross, c), cross, c);
}

TEST_CASE("decode dumps at awkward shapes give exact attention by its definition", "[decode][dumps]") {
  for (const auto& [nq, nk, p] : {std::tuple<int64_t, int64_t, int64_t>{1, 97, 64},
                                  {7, 1025, 128},
                                  {64, 4096, 50},
                                  {64, 97, 128},
                                  {1, 4096, 50}}) {
    const DecodeData d(nq, nk, p, 13);
    for (const LayerAttributes& a : {LayerAttributes{.causal = 1}, LayerAttributes{.causal = 1, .window = 33}})
      check_exact(hdf5_dump(fmt::format("awkward-{}-{}-{}.h5", nq, nk, p), d, a), d, a);
  }
}

TEST_CASE("a decode dump's float32 rows are those of the self-attention slice that ends with them", "[decode][dumps]") {
  // The same keys with the query rows of every position: its last rows, computed with the whole slice, are the
  // decode dump's rows bit for bit (the kernel blocks queries by absolute position).
  const DecodeData d(7, 1025, 64, 14);
  const Dump dump = Dump::open(hdf5_dump("bits.h5", d, {.causal = 1}));
  HeadView decode = dump.read_slice(0, 3, 1, d.nk);
  decode.mask = Mask::kCausal;
  MatrixD q = MatrixD::Random(d.nk, d.p);
  q.bottomRows(d.nq) = decode.q;
  const HeadView whole = make_head_view(SliceId{}, decode.scale, q, decode.k, decode.v, Mask::kCausal);
  MatrixF all, rows;
  exact_attention_f32(whole.qf, whole.kf, whole.vf, static_cast<float>(whole.scale), all, nullptr, whole.geometry());
  exact_attention_f32(decode.qf, decode.kf, decode.vf, static_cast<float>(decode.scale), rows, nullptr,
                      decode.geometry());
  CHECK(test::rows_identical(all.bottomRows(d.nq), rows, d.nq));
}

TEST_CASE("sweep measures a decode dump's own rows against the whole cache", "[decode][dumps][cli]") {
  const DecodeData d(7, 97, 50, 15);
  const std::string path = npz_dump("sweep-decode.npz", d, {.causal = 1, .window = 24});
  const std::string csv = test::temp_path("sweep-decode.csv");
  const auto run = test::run_attnprobe(fmt::format(
      "sweep {} -e softmax -e vmean -e 'uniform_keys(b=8)' --trials 2 --metrics spec_rel,row_tv -q --overwrite -o {}",
      path, csv));
  INFO(run.output);
  REQUIRE(run.exit_code == 0);
  const CsvContents rows = read_csv(csv);
  REQUIRE(!rows.trials.empty());
  for (const TrialRow& r : rows.trials) {
    CHECK(r.key.n.value() == 97);
    CHECK(r.key.mask == Mask::kWindow);
    CHECK(r.key.window == 24);
    CHECK(r.key.queries.kind == QueryRows::Kind::kDump);
    if (r.key.estimator == "softmax") CHECK(r.value < 1e-6);  // float32 rounding (observed ≤ 4.5e-7)
  }
  const auto info = test::run_attnprobe("info " + path);
  CHECK_THAT(info.output, Catch::Contains("7/97") && Catch::Contains("window:24"));
}

TEST_CASE("malformed decode dumps and impossible requests exit 2 or 3 saying what to do", "[decode][dumps][hostile]") {
  const DecodeData d(7, 97, 16, 16);
  struct Bad {
    std::string name;
    LayerAttributes attributes;
    std::vector<std::string> words;
  };
  const std::vector<Bad> bad_files = {
      {"unordered.h5", {.causal = 1, .positions = {3, 10, 10, 40, 60, 80, 96}}, {"increase strictly", "row 2"}},
      {"beyond.h5", {.causal = 1, .positions = {3, 10, 20, 40, 60, 80, 97}}, {"q_positions", "97", "0..96"}},
      {"negative.h5", {.causal = 1, .positions = {-1, 10, 20, 40, 60, 80, 96}}, {"q_positions", "-1"}},
      {"short.h5", {.causal = 1, .positions = {3, 10, 20}}, {"q_positions", "[7]"}},
      {"cross-causal.h5", {.causal = 1, .cross = true}, {"cross = 1 and causal = 1"}},
      {"window-no-causal.h5", {.causal = 0, .window = 8}, {"needs causal = 1"}},
      {"cross-positions.h5",
       {.causal = 0, .cross = true, .positions = {3, 10, 20, 40, 60, 80, 96}},
       {"cross-attention", "Remove one"}},
  };
  for (const Bad& bad : bad_files) {
    INFO(bad.name);
    const auto run = test::run_attnprobe("info " + hdf5_dump(bad.name, d, bad.attributes));
    CHECK(run.exit_code == 3);
    CHECK_THAT(run.output, Catch::Contains(bad.name));
    for (const std::string& word : bad.words) CHECK_THAT(run.output, Catch::Contains(word));
  }
  // More queries than keys without cross = 1.
  const DecodeData wide(7, 5, 16, 17);
  const auto wide_run = test::run_attnprobe("info " + hdf5_dump("wide.h5", wide, {.causal = 0}));
  CHECK(wide_run.exit_code == 3);
  CHECK_THAT(wide_run.output, Catch::Contains("cross = 1") && Catch::Contains("7 tokens"));

  const std::string good = hdf5_dump("good.h5", d, {.causal = 1});
  const std::string cross = hdf5_dump("cross-good.h5", wide, {.causal = 0, .cross = true});
  const std::vector<std::pair<std::string, std::vector<std::string>>> bad_requests = {
      {fmt::format("eval {} -e softmax --length 50 -q", good), {"--lengths 50", "leave --lengths out"}},
      {fmt::format("eval {} -e softmax --queries last:2 -q", good), {"--queries applies to self-attention"}},
      {fmt::format("eval {} -e softmax --mask causal -q", cross), {"only --mask full"}},
      {fmt::format("eval {} -e nystrom --mask full -q", good), {"no decode form", "softmax"}},
      {fmt::format("eval {} -e vmean --metrics grad_v_fro_rel -q", good), {"self-attention"}},
  };
  for (const auto& [command, words] : bad_requests) {
    INFO(command);
    const auto run = test::run_attnprobe(command);
    CHECK(run.exit_code == 2);
    for (const std::string& word : words) CHECK_THAT(run.output, Catch::Contains(word));
  }
  CHECK(test::run_attnprobe(fmt::format("eval {} -e softmax -q", cross)).exit_code == 0);
}

}  // namespace attnprobe

namespace attnprobe {

TEST_CASE("streaming(roll=0) needs a prompt's position only: it runs on a decode dump as on the slice it ends",
          "[decode][dumps][selection]") {
  const DecodeData d(7, 97, 16, 16);
  const std::string path = hdf5_dump("roll0.h5", d, {.causal = 1});
  const Dump dump = Dump::open(path);
  HeadView decode = dump.read_slice(0, 1, 0, d.nk);
  decode.mask = Mask::kCausal;
  MatrixD q = MatrixD::Random(d.nk, d.p);
  q.bottomRows(d.nq) = decode.q;
  const HeadView whole = make_head_view(SliceId{}, decode.scale, q, decode.k, decode.v, Mask::kCausal);
  const std::string spec = "streaming(sink=2,window=8,roll=0)";
  CHECK(
      test::rows_identical(test::run_estimator(spec, decode), test::run_estimator(spec, last_rows(whole, d.nq)), d.nq));
  // On the command line it runs there, while a method that reads the prompt's queries is refused.
  const auto roll = test::run_attnprobe(fmt::format("eval {} -e '{}' --mask causal -q", path, spec));
  INFO(roll.output);
  CHECK(roll.exit_code == 0);
  const auto snapkv = test::run_attnprobe(fmt::format("eval {} -e snapkv --mask causal -q", path));
  CHECK(snapkv.exit_code == 3);
  CHECK_THAT(snapkv.output, Catch::Contains("prompt's query rows"));
}

}  // namespace attnprobe
