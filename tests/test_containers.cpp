// Dump containers (issue 14): the same Q/K/V stored as HDF5, safetensors and .npz read back
// identically; bfloat16 and float16 widen exactly; grouped-query K/V (Hkv dividing H) map query
// head h to kv head h / (H / Hkv); and every malformed safetensors/.npz variant is an InputError
// (exit 3) naming the file and the tensor, never a crash. Files are built byte by byte
// (container_bytes.h) so each test damages exactly one field.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "attnprobe/common/error.h"
#include "attnprobe/io/dump.h"
#include "attnprobe/io/dump_writer.h"
#include "attnprobe/io/raw_array.h"
#include "container_bytes.h"
#include "support.h"

using namespace attnprobe;
using namespace attnprobe::test;

namespace {

constexpr int kBatch = 1, kHeads = 4, kKvHeads = 2, kTokens = 12, kDim = 4, kValueDim = 3;

// Seeded float32 values of the q [1, 4, 12, 4], k [1, 2, 12, 4], v [1, 2, 12, 3] of every test here.
std::vector<float> values(size_t count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> out(count);
  for (float& x : out) x = normal(rng);
  return out;
}
const std::vector<float>& q_values() {
  static const auto v = values(kBatch * kHeads * kTokens * kDim, 1);
  return v;
}
const std::vector<float>& k_values() {
  static const auto v = values(kBatch * kKvHeads * kTokens * kDim, 2);
  return v;
}
const std::vector<float>& v_values() {
  static const auto v = values(kBatch * kKvHeads * kTokens * kValueDim, 3);
  return v;
}

std::string write_file(const std::string& name, const std::string& bytes) {
  const std::string path = temp_path(name);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  return path;
}

std::vector<StTensor> qkv_tensors() {
  return {{"layer_00.q", "F32", {kBatch, kHeads, kTokens, kDim}, raw_bytes(q_values())},
          {"layer_00.k", "F32", {kBatch, kKvHeads, kTokens, kDim}, raw_bytes(k_values())},
          {"layer_00.v", "F32", {kBatch, kKvHeads, kTokens, kValueDim}, raw_bytes(v_values())}};
}
const std::map<std::string, std::string> kMetadata = {
    {"model", "tiny"}, {"layer_00.scale", "0.5"}, {"layer_00.causal", "1"}};

std::string safetensors_dump(const std::string& name) {
  return write_file(name, safetensors_file(qkv_tensors(), kMetadata));
}

std::vector<std::pair<std::string, std::string>> npz_entries() {
  return {{"layer_00.q.npy", npy_bytes("<f4", {kBatch, kHeads, kTokens, kDim}, raw_bytes(q_values()))},
          {"layer_00.k.npy", npy_bytes("<f4", {kBatch, kKvHeads, kTokens, kDim}, raw_bytes(k_values()))},
          {"layer_00.v.npy", npy_bytes("<f4", {kBatch, kKvHeads, kTokens, kValueDim}, raw_bytes(v_values()))},
          {"layer_00.scale.npy", npy_bytes("<f8", {}, raw_bytes(std::vector<double>{0.5}))},
          {"layer_00.causal.npy", npy_bytes("<i8", {}, raw_bytes(std::vector<int64_t>{1}))}};
}

DumpArray array_of(const std::vector<float>& v, std::vector<hsize_t> shape) {
  return DumpArray{std::move(shape), std::vector<double>(v.begin(), v.end())};
}

// The same data as HDF5, K/V with `repeat` times the kv heads (1: grouped, 2: repeated to H).
std::string hdf5_dump(const std::string& name, int repeat) {
  std::vector<float> k, v;
  for (int h = 0; h < kKvHeads; ++h)
    for (int r = 0; r < repeat; ++r) {
      k.insert(k.end(), k_values().begin() + h * kTokens * kDim, k_values().begin() + (h + 1) * kTokens * kDim);
      v.insert(v.end(), v_values().begin() + h * kTokens * kValueDim,
               v_values().begin() + (h + 1) * kTokens * kValueDim);
    }
  const hsize_t kv = kKvHeads * repeat;
  DumpContents c;
  DumpLayer layer;
  layer.name = "layer_00";
  layer.datasets = {{"q", array_of(q_values(), {kBatch, kHeads, kTokens, kDim})},
                    {"k", array_of(k, {kBatch, kv, kTokens, kDim})},
                    {"v", array_of(v, {kBatch, kv, kTokens, kValueDim})}};
  layer.scale = 0.5;
  layer.causal = 1;
  c.layers.push_back(layer);
  c.attributes["model"] = "tiny";  // written NULLPAD, 4 bytes: read back "tin" before the fix
  const std::string path = temp_path(name);
  write_dump(path, c, {});
  return path;
}

// The InputError message of opening `path` and reading every slice ("" when it succeeds).
std::string refusal(const std::string& path) {
  try {
    const Dump dump = Dump::open(path);
    for (const LayerInfo& l : dump.layers())
      for (int h = 0; h < l.heads; ++h)
        for (int b = 0; b < l.batch; ++b) dump.read_slice(l.number, h, b, l.lengths[b]);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("HDF5, safetensors and .npz (stored and deflated) dumps of the same data read identically", "[containers]") {
  const std::string h5 = hdf5_dump("same.h5", 1);
  const std::string st = safetensors_dump("same.safetensors");
  const std::string stored = write_file("same-stored.npz", zip_file(npz_entries(), false));
  const std::string deflated = write_file("same-deflated.npz", zip_file(npz_entries(), true));
  const Dump reference = Dump::open(h5);
  for (const std::string& path : {st, stored, deflated}) {
    const Dump dump = Dump::open(path);
    INFO(path << " (" << dump.format() << ")");
    REQUIRE(dump.layers().size() == 1);
    const LayerInfo& l = dump.layers()[0];
    CHECK(l.heads == kHeads);
    CHECK(l.kv_heads == kKvHeads);
    CHECK(l.scale == 0.5);
    CHECK(l.causal == 1);
    CHECK(l.dtype == "float32");
    for (int h = 0; h < kHeads; ++h) {
      const HeadView a = reference.read_slice(0, h, 0, kTokens), b = dump.read_slice(0, h, 0, kTokens);
      CHECK(a.q == b.q);
      CHECK(a.k == b.k);
      CHECK(a.v == b.v);
      const HeadView prefix = dump.read_slice(0, h, 0, 5);
      CHECK(prefix.q == a.q.topRows(5));
    }
  }
  CHECK(Dump::open(st).root_attribute("model") == "tiny");
  CHECK(Dump::open(h5).root_attribute("model") == "tiny");
  CHECK(Dump::open(st).format() == "safetensors");
  CHECK(Dump::open(deflated).format() == "npz");
  CHECK(Dump::open(h5).format() == "HDF5");

  // The CLI takes all three through the same Dump::open: the same numbers in eval's CSV.
  std::vector<std::string> csvs;
  for (const std::string& path : {h5, st, deflated}) {
    const std::string csv = temp_path("same-" + std::to_string(csvs.size()) + ".csv");
    const auto r = run_attnprobe("eval " + path + " -e softmax -e 'yoso(m=8)' --trials 2 -q -o " + csv);
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    std::string text = read_text(csv);
    const std::string label = std::filesystem::path(path).filename().string();  // the CSV's dump column
    for (size_t at; (at = text.find(label)) != std::string::npos;) text.replace(at, label.size(), "DUMP");
    csvs.push_back(text);
  }
  CHECK(csvs[0] == csvs[1]);
  CHECK(csvs[0] == csvs[2]);
}

TEST_CASE("bfloat16 and float16 tensors widen exactly", "[containers]") {
  // bf16 bits: 1, -2, the smallest subnormal 2^-133, 3.3 rounded (3.296875), 2^24, 0.125.
  const std::vector<uint16_t> bf16 = {0x3F80, 0xC000, 0x0001, 0x4053, 0x4B80, 0x3E00};
  // f16 bits: 1, -2, the smallest subnormal 2^-24, 65504 (the largest), 0.333251953125, -0.0.
  const std::vector<uint16_t> f16 = {0x3C00, 0xC000, 0x0001, 0x7BFF, 0x3555, 0x8000};
  const std::vector<double> bf16_expected = {1.0, -2.0, std::ldexp(1.0, -133), 3.296875, 16777216.0, 0.125};
  const std::vector<double> f16_expected = {1.0, -2.0, std::ldexp(1.0, -24), 65504.0, 0.333251953125, -0.0};
  for (const std::string dtype : {"BF16", "F16"}) {
    const auto& bits = dtype == "BF16" ? bf16 : f16;
    const auto& expected = dtype == "BF16" ? bf16_expected : f16_expected;
    const std::vector<StTensor> tensors = {{"layer_00.q", dtype, {3, 2}, raw_bytes(bits)},
                                           {"layer_00.k", dtype, {3, 2}, raw_bytes(bits)},
                                           {"layer_00.v", dtype, {3, 2}, raw_bytes(bits)}};
    const std::string path = write_file("widen-" + dtype + ".safetensors", safetensors_file(tensors, {}));
    const Dump dump = Dump::open(path);
    CHECK(dump.layers()[0].dtype == (dtype == "BF16" ? "bfloat16" : "float16"));
    const HeadView view = dump.read_slice(0, 0, 0, 3);
    for (int i = 0; i < 6; ++i) {
      INFO(dtype << " element " << i);
      CHECK(view.q(i / 2, i % 2) == expected[i]);
      CHECK(std::signbit(view.v(i / 2, i % 2)) == std::signbit(expected[i]));
    }
  }
  // Every finite pattern against the definition (-1)^s · 2^(e - bias) · (1 + m / 2^t), subnormals
  // 2^(1 - bias) · m / 2^t, evaluated in float64 (exactly: at most 24 significant bits).
  for (uint32_t b = 0; b < 65536; ++b) {
    const auto bits = static_cast<uint16_t>(b);
    const int sign = b >> 15;
    const int h_exp = (b >> 10) & 31, h_man = b & 1023;
    if (h_exp != 31) {
      const double h =
          (h_exp ? std::ldexp(1.0 + h_man / 1024.0, h_exp - 15) : std::ldexp(h_man / 1024.0, -14)) * (sign ? -1 : 1);
      if (static_cast<double>(half_to_float(bits)) != h) FAIL("float16 " << b << " widens wrongly");
    }
    const int b_exp = (b >> 7) & 255, b_man = b & 127;
    if (b_exp != 255) {
      const double f =
          (b_exp ? std::ldexp(1.0 + b_man / 128.0, b_exp - 127) : std::ldexp(b_man / 128.0, -126)) * (sign ? -1 : 1);
      if (static_cast<double>(bfloat16_to_float(bits)) != f) FAIL("bfloat16 " << b << " widens wrongly");
    }
  }
}

TEST_CASE("grouped-query K/V: query head h reads kv head h / (H / Hkv), in every container", "[containers][gqa]") {
  const Dump repeated = Dump::open(hdf5_dump("gqa-repeated.h5", 2));
  CHECK(repeated.layers()[0].kv_heads == kHeads);
  for (const std::string& path : {hdf5_dump("gqa.h5", 1), safetensors_dump("gqa.safetensors"),
                                  write_file("gqa.npz", zip_file(npz_entries(), true))}) {
    const Dump grouped = Dump::open(path);
    INFO(path);
    CHECK(grouped.layers()[0].heads == kHeads);
    CHECK(grouped.layers()[0].kv_heads == kKvHeads);
    for (int h = 0; h < kHeads; ++h) {
      const HeadView a = repeated.read_slice(0, h, 0, kTokens), b = grouped.read_slice(0, h, 0, kTokens);
      CHECK(a.q == b.q);
      CHECK(a.k == b.k);
      CHECK(a.v == b.v);
    }
  }
  // Heads 0, 1 share kv head 0 and heads 2, 3 kv head 1 (not 0, 2 / 1, 3: the repeat_kv convention).
  const Dump grouped = Dump::open(safetensors_dump("gqa-map.safetensors"));
  CHECK(grouped.read_slice(0, 1, 0, kTokens).k == grouped.read_slice(0, 0, 0, kTokens).k);
  CHECK(grouped.read_slice(0, 2, 0, kTokens).k != grouped.read_slice(0, 1, 0, kTokens).k);

  // The same eval numbers from the grouped and the repeated dump.
  const std::string a = temp_path("gqa-a.csv"), b = temp_path("gqa-b.csv");
  const std::string grouped_path = safetensors_dump("gqa-eval.safetensors"), repeated_path = hdf5_dump("gqa-r.h5", 2);
  REQUIRE(run_attnprobe("eval " + grouped_path + " -e softmax -e vmean -q -o " + a).exit_code == 0);
  REQUIRE(run_attnprobe("eval " + repeated_path + " -e softmax -e vmean -q -o " + b).exit_code == 0);
  std::string ta = read_text(a), tb = read_text(b);
  for (auto [text, path] : {std::pair{&ta, grouped_path}, std::pair{&tb, repeated_path}})
    for (const std::string label = std::filesystem::path(path).filename().string();;) {
      const size_t at = text->find(label);
      if (at == std::string::npos) break;
      text->replace(at, label.size(), "DUMP");
    }
  CHECK(ta == tb);

  // H not a multiple of Hkv: exit 3 naming both.
  auto tensors = qkv_tensors();
  tensors[1] = {"layer_00.k", "F32", {kBatch, 3, kTokens, kDim}, raw_bytes(values(3 * kTokens * kDim, 2))};
  tensors[2] = {"layer_00.v", "F32", {kBatch, 3, kTokens, kValueDim}, raw_bytes(values(3 * kTokens * kValueDim, 3))};
  const std::string bad = write_file("gqa-bad.safetensors", safetensors_file(tensors, {}));
  const auto r = run_attnprobe("info " + bad);
  INFO(r.output);
  CHECK(r.exit_code == exit_code::kInput);
  CHECK_THAT(r.output, Catch::Contains("q has 4 heads and k/v 3") && Catch::Contains(bad));
  const auto info = run_attnprobe("info " + grouped_path);
  CHECK_THAT(info.output, Catch::Contains("kv heads") && Catch::Contains("(safetensors)"));
}

TEST_CASE("malformed safetensors files are input errors naming the file and the tensor", "[containers][hostile]") {
  struct Case {
    std::string name, bytes;
    std::vector<std::string> says;
  };
  const std::string good = safetensors_file(qkv_tensors(), kMetadata);
  auto with_header = [&](const std::string& json) {
    std::string data;
    for (const StTensor& t : qkv_tensors()) data += t.bytes;
    std::string header = json;
    while (header.size() % 8) header += ' ';
    return le_bytes(header.size(), 8) + header + data;
  };
  const std::string q = "\"layer_00.q\":{\"dtype\":\"F32\",\"shape\":[1,4,12,4],\"data_offsets\":[0,768]}";
  const std::string k = "\"layer_00.k\":{\"dtype\":\"F32\",\"shape\":[1,2,12,4],\"data_offsets\":[768,1152]}";
  const std::string v = "\"layer_00.v\":{\"dtype\":\"F32\",\"shape\":[1,2,12,3],\"data_offsets\":[1152,1440]}";
  std::vector<StTensor> missing = qkv_tensors();
  missing.erase(missing.begin() + 1);
  std::vector<StTensor> rank = qkv_tensors();
  rank[1].shape = {2, 12, 4};
  const std::vector<Case> cases = {
      {"short.safetensors", good.substr(0, 5), {"not an HDF5 file"}},
      {"eight.safetensors", good.substr(0, 8), {"has 0 bytes after it"}},
      {"huge-header.safetensors", le_bytes(1ull << 40, 8) + good.substr(8), {"header length"}},
      {"header-past-end.safetensors", le_bytes(good.size(), 8) + good.substr(8), {"header length"}},
      {"not-json.safetensors", with_header("{\"layer_00.q\": nonsense}"), {"not JSON"}},
      {"offsets-past-end.safetensors",
       with_header("{" + q + "," + k + "," + v.substr(0, v.size() - 12) + "[1152,9999]}}"),
       {"layer_00.v", "past the end"}},
      {"overlap.safetensors",
       with_header("{" + q + "," +
                   "\"layer_00.k\":{\"dtype\":\"F32\",\"shape\":[1,2,12,4],\"data_offsets\":[700,1084]}," + v + "}"),
       {"layer_00.q", "layer_00.k", "overlap"}},
      {"dtype.safetensors",
       with_header("{" + q + "," + k + "," + std::string(v).replace(v.find("F32"), 3, "F17") + "}"),
       {"layer_00.v", "unknown safetensors dtype 'F17'"}},
      {"byte-count.safetensors",
       with_header("{" + q + "," + k + "," + std::string(v).replace(v.find("[1,2,12,3]"), 10, "[1,2,12,4]") + "}"),
       {"layer_00.v", "needs 384 bytes"}},
      {"missing.safetensors", safetensors_file(missing, {}), {"no tensor layer_00.k"}},
      {"rank.safetensors", safetensors_file(rank, {}), {"layer_00.k", "different ranks"}},
      {"metadata.safetensors",
       safetensors_file(qkv_tensors(), {{"layer_00.scale", "half"}}),
       {"layer_00.scale", "not one number"}},
      {"truncated-data.safetensors", good.substr(0, good.size() - 100), {"past the end"}},
      // A valid file but for 200000 nested arrays beside a tensor's fields: printing that entry in a
      // message recursed once per level and overflowed the stack.
      {"deep.safetensors",
       with_header("{" + q + "," + k + "," + v.substr(0, v.size() - 1) + ",\"extra\":" + std::string(200000, '[') +
                   std::string(200000, ']') + "}}"),
       {"nests deeper than 16 levels"}},
  };
  for (const Case& c : cases) {
    const std::string path = write_file(c.name, c.bytes);
    const std::string message = refusal(path);
    INFO(c.name << ": " << message);
    CHECK_THAT(message, Catch::Contains(path));
    for (const std::string& s : c.says) CHECK_THAT(message, Catch::Contains(s));
  }
  // Through the binary: exit 3, not a crash (the mmap of a truncated file is never touched past its end).
  const auto r =
      run_attnprobe("info " + write_file("cli-truncated.safetensors", good.substr(0, good.size() - 100)), 60);
  CHECK(r.exit_code == exit_code::kInput);
}

TEST_CASE("malformed .npz files are input errors naming the file and the array", "[containers][hostile]") {
  struct Case {
    std::string name, bytes;
    std::vector<std::string> says;
  };
  const std::string stored = zip_file(npz_entries(), false), deflated = zip_file(npz_entries(), true);
  auto replace_entry = [](size_t index, const std::string& name, const std::string& npy) {
    auto entries = npz_entries();
    entries[index] = {name, npy};
    return entries;
  };
  std::string bad_crc = stored;
  bad_crc[bad_crc.find("\x93NUMPY") + 200] ^= 0x40;  // one bit of q's data
  std::string bad_deflate = deflated;
  const size_t q_data = bad_deflate.find("layer_00.q.npy") + 14;  // first byte after the local header's name
  for (size_t i = q_data + 2; i < q_data + 40; ++i) bad_deflate[i] = static_cast<char>(0xFF);
  std::string inflated_size = deflated;  // the central directory's size of q: 4 GB from a few hundred bytes
  const size_t central_q = inflated_size.find("layer_00.q.npy", inflated_size.find("layer_00.q.npy") + 1) - 46;
  inflated_size.replace(central_q + 24, 4, le_bytes(0xFFFFFFF0u, 4));
  auto missing = npz_entries();
  missing.erase(missing.begin() + 2);
  auto twice = npz_entries();  // a second q: the first was read, numpy reads the last
  twice.push_back(twice[0]);
  auto scalar = npz_entries();  // rank 0: read as one 1 × 1 slice before
  for (auto& entry : scalar) {
    const std::string& name = entry.first;
    if (name != "layer_00.scale.npy" && name != "layer_00.causal.npy")
      entry.second = npy_bytes("<f4", {}, raw_bytes(std::vector<float>{1}));
  }
  const std::vector<Case> cases = {
      {"truncated.npz", stored.substr(0, stored.size() / 2), {"truncated"}},
      {"no-directory.npz", stored.substr(0, stored.size() - 10), {"end-of-central-directory"}},
      {"crc.npz", bad_crc, {"layer_00.q", "CRC-32"}},
      {"deflate.npz", bad_deflate, {"layer_00.q"}},
      {"fortran.npz",
       zip_file(replace_entry(0, "layer_00.q.npy",
                              npy_bytes("<f4", {kBatch, kHeads, kTokens, kDim}, raw_bytes(q_values()), true)),
                false),
       {"layer_00.q", "Fortran"}},
      {"descr.npz",
       zip_file(replace_entry(1, "layer_00.k.npy",
                              npy_bytes(">f4", {kBatch, kKvHeads, kTokens, kDim}, raw_bytes(k_values()))),
                true),
       {"layer_00.k", "'>f4'"}},
      {"byte-count.npz",
       zip_file(replace_entry(2, "layer_00.v.npy",
                              npy_bytes("<f4", {kBatch, kKvHeads, kTokens, kValueDim + 1}, raw_bytes(v_values()))),
                false),
       {"layer_00.v", "needs"}},
      {"missing.npz", zip_file(missing, false), {"no array layer_00.v"}},
      {"rank.npz",
       zip_file(replace_entry(1, "layer_00.k.npy", npy_bytes("<f4", {kKvHeads, kTokens, kDim}, raw_bytes(k_values()))),
                false),
       {"layer_00.k", "different ranks"}},
      {"scale.npz",
       zip_file(replace_entry(3, "layer_00.scale.npy", npy_bytes("<f8", {2}, raw_bytes(std::vector<double>{1, 2}))),
                false),
       {"layer_00.scale", "one number"}},
      {"not-npy.npz", zip_file({{"layer_00.q.txt", "hello"}}, false), {"layer_00.q.txt", "not a .npy"}},
      {"inflated-size.npz", inflated_size, {"layer_00.q", "more than deflate can produce"}},
      {"twice.npz", zip_file(twice, false), {"two entries named layer_00.q.npy"}},
      {"scalar.npz", zip_file(scalar, false), {"q has rank 0"}},
  };
  for (const Case& c : cases) {
    const std::string path = write_file(c.name, c.bytes);
    const std::string message = refusal(path);
    INFO(c.name << ": " << message);
    CHECK_THAT(message, Catch::Contains(path));
    for (const std::string& s : c.says) CHECK_THAT(message, Catch::Contains(s));
  }
  const auto r = run_attnprobe("info " + write_file("cli-crc.npz", bad_crc), 60);
  INFO(r.output);
  CHECK(r.exit_code == exit_code::kInput);
  CHECK_THAT(r.output, Catch::Contains("CRC"));
}

TEST_CASE("a file that is no container is an input error saying which containers are read", "[containers]") {
  const std::string path = write_file("plain.txt", "hello, this is not a dump at all\n");
  const std::string message = refusal(path);
  CHECK_THAT(message, Catch::Contains(path) && Catch::Contains("safetensors") && Catch::Contains(".npz"));
}

TEST_CASE("synth --kv-heads writes grouped K/V: each group's first query head's keys and values", "[containers][gqa]") {
  SynthOptions full = synth_options(1, 4, 1, 20, 4);
  SynthOptions grouped = full;
  grouped.kv_heads = 2;
  const Dump a = Dump::open(write_synth("synth-full.h5", full)), b = Dump::open(write_synth("synth-gqa.h5", grouped));
  CHECK(b.layers()[0].heads == 4);
  CHECK(b.layers()[0].kv_heads == 2);
  for (int h = 0; h < 4; ++h) {
    const HeadView x = a.read_slice(0, h, 0, 20), y = b.read_slice(0, h, 0, 20);
    const HeadView first = a.read_slice(0, h - h % 2, 0, 20);  // the group's first head
    CHECK(x.q == y.q);
    CHECK(first.k == y.k);
    CHECK(first.v == y.v);
  }
  grouped.kv_heads = 3;
  CHECK_THROWS_AS(make_synthetic_dump(grouped), UsageError);
}
