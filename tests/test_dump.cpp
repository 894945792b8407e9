// Reading dumps: dtypes, compression, ranks and layouts, lengths, attributes, the real dumps, and
// every kind of bad input with the message it must give.
#include <cmath>
#include <filesystem>
#include <fstream>

#include "attnprobe/common/error.h"
#include "attnprobe/exact/exact_attention.h"
#include "support.h"

using namespace attnprobe;
using namespace attnprobe::test;

namespace {

SynthOptions tiny(int layers = 2, int heads = 3, int batch = 2, int64_t tokens = 40, int dim = 8) {
  return synth_options(layers, heads, batch, tokens, dim);
}

// A dump with arbitrary arrays under /layer_00 (for layouts and malformed files).
std::string write_arrays(const std::string& name, std::map<std::string, DumpArray> arrays,
                         std::optional<double> scale = std::nullopt) {
  DumpContents c;
  DumpLayer layer;
  layer.name = "layer_00";
  layer.datasets = std::move(arrays);
  layer.scale = scale;
  c.layers.push_back(layer);
  const std::string path = temp_path(name);
  write_dump(path, c, {});
  return path;
}

DumpArray iota_array(std::vector<hsize_t> shape, double offset = 0) {
  DumpArray a;
  a.shape = shape;
  size_t total = 1;
  for (auto d : shape) total *= d;
  for (size_t i = 0; i < total; ++i) a.values.push_back(offset + 0.01 * static_cast<double>(i));
  return a;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no InputError)";
}

}  // namespace

TEST_CASE("synthetic dumps read back in every dtype compressed or not", "[dump]") {
  const SynthOptions o = tiny();
  const std::string ref_path = write_synth("f64.h5", o, StoredType::kFloat64);
  const HeadView ref = Dump::open(ref_path).read_slice(1, 2, 1, 40);
  for (auto [type, gzip, tolerance] :
       {std::tuple{StoredType::kFloat32, 0, 1e-6}, std::tuple{StoredType::kFloat32, 6, 1e-6},
        std::tuple{StoredType::kFloat16, 4, 2e-3}}) {
    const std::string path = write_synth(fmt::format("t{}-{}.h5", static_cast<int>(type), gzip), o, type, gzip);
    const Dump dump = Dump::open(path);
    REQUIRE(dump.layers().size() == 2);
    const LayerInfo& info = dump.layer(1);
    CHECK(info.batch == 2);
    CHECK(info.heads == 3);
    CHECK(info.tokens == 40);
    CHECK(info.dim == 8);
    CHECK(info.compressed == (gzip > 0));
    CHECK(info.dtype == (type == StoredType::kFloat16 ? "float16" : "float32"));
    CHECK(info.scale == Approx(1 / std::sqrt(8.0)));
    const HeadView view = dump.read_slice(1, 2, 1, 40);
    // Relative rounding of float32 (6e-8) and float16 (4.9e-4) per value, magnitudes ≤ ~4.
    CHECK((view.q - ref.q).cwiseAbs().maxCoeff() < tolerance * 4);
    CHECK((view.v - ref.v).cwiseAbs().maxCoeff() < tolerance * 8);
  }
}

TEST_CASE("a length L reads the prefix of L tokens", "[dump]") {
  const std::string path = write_synth("prefix.h5", tiny());
  const Dump dump = Dump::open(path);
  const HeadView full = dump.read_slice(0, 1, 0, 40);
  const HeadView part = dump.read_slice(0, 1, 0, 17);
  CHECK(part.n() == 17);
  CHECK(part.q == full.q.topRows(17));
  CHECK(part.k == full.k.topRows(17));
  CHECK(part.v == full.v.topRows(17));
}

TEST_CASE("synth is a pure function of its options", "[dump][synth]") {
  SynthOptions o = tiny();
  const std::string a = write_synth("same-a.h5", o), b = write_synth("same-b.h5", o);
  CHECK(read_text(a) == read_text(b));
  o.seed = 1;
  CHECK(read_text(write_synth("other.h5", o)) != read_text(a));
}

TEST_CASE("synth temperature controls how peaked attention is", "[dump][synth]") {
  SynthOptions o = tiny(2, 1, 1, 200, 32);
  o.temperatures = {0.05, 5.0};
  const Dump dump = Dump::open(write_synth("temps.h5", o));
  auto entropy = [&](int layer) {
    const HeadView v = dump.read_slice(layer, 0, 0, 200);
    double total = 0;
    for (int64_t i = 0; i < v.n(); ++i) {
      Eigen::RowVectorXd l = v.scale * (v.q.row(i) * v.k.transpose());
      l.array() -= l.maxCoeff();
      const Eigen::RowVectorXd pr = l.array().exp() / l.array().exp().sum();
      total -= (pr.array() * (pr.array() + 1e-300).log()).sum();
    }
    return total / v.n();
  };
  // Uniform over 200 keys: ln 200 = 5.3. With 8 clusters, T = 0.05 concentrates each query on
  // its cluster (~25 keys, entropy ≈ ln 25 = 3.2); T = 5 is nearly uniform. Observed: 2.96, 5.296.
  CHECK(entropy(0) < 3.6);
  CHECK(entropy(1) > 5.2);
}

TEST_CASE("lengths dataset limits each batch item", "[dump]") {
  SynthOptions o = tiny(1, 1, 3, 30);
  o.lengths = {30, 12, 1};
  const Dump dump = Dump::open(write_synth("lengths.h5", o));
  CHECK(dump.layer(0).has_lengths);
  CHECK(dump.layer(0).lengths == std::vector<int64_t>{30, 12, 1});
  CHECK(dump.read_slice(0, 0, 1, 12).n() == 12);
  const std::string message = error_of([&] { dump.read_slice(0, 0, 1, 13); });
  CHECK_THAT(message, Catch::Contains("length 13") && Catch::Contains("batch item 1") &&
                          Catch::Contains("12 valid tokens") && Catch::Contains("lengths.h5"));
}

TEST_CASE("rank-3 HNP and rank-2 NP datasets are read with B = 1 and H = 1", "[dump][layout]") {
  const std::string r3 = write_arrays(
      "rank3.h5", {{"q", iota_array({2, 5, 4})}, {"k", iota_array({2, 5, 4}, 1)}, {"v", iota_array({2, 5, 3}, 2)}});
  const Dump d3 = Dump::open(r3);
  CHECK(d3.layer(0).heads == 2);
  CHECK(d3.layer(0).batch == 1);
  const HeadView v3 = d3.read_slice(0, 1, 0, 5);
  CHECK(v3.q(0, 0) == Approx(0.01 * 20));  // head 1 starts at element 5·4
  CHECK(v3.v.cols() == 3);
  const std::string r2 =
      write_arrays("rank2.h5", {{"q", iota_array({6, 4})}, {"k", iota_array({6, 4})}, {"v", iota_array({6, 4})}}, 0.5);
  const Dump d2 = Dump::open(r2);
  CHECK(d2.layer(0).heads == 1);
  CHECK(d2.layer(0).scale == 0.5);
  CHECK(d2.read_slice(0, 0, 0, 6).q(5, 3) == Approx(0.01 * 23));
}

TEST_CASE("layout bnhp and layout bnp with num_heads read other orders", "[dump][layout]") {
  // [B=2, N=3, H=2, P=4]: element (b, n, h, p) at ((b·3 + n)·2 + h)·4 + p.
  const std::string bnhp = write_arrays(
      "bnhp.h5", {{"q", iota_array({2, 3, 2, 4})}, {"k", iota_array({2, 3, 2, 4})}, {"v", iota_array({2, 3, 2, 4})}});
  DumpOptions options;
  options.layout = "bnhp";
  const HeadView a = Dump::open(bnhp, options).read_slice(0, 1, 1, 3);
  CHECK(a.q(2, 3) == Approx(0.01 * (((1 * 3 + 2) * 2 + 1) * 4 + 3)));
  // The same bytes seen as [B, N, H·P] split into 2 heads.
  DumpArray flat = iota_array({2, 3, 8});
  const std::string bnp = write_arrays("bnp.h5", {{"q", flat}, {"k", flat}, {"v", flat}});
  DumpOptions split;
  split.layout = "bnp";
  split.num_heads = 2;
  const Dump d = Dump::open(bnp, split);
  CHECK(d.layer(0).heads == 2);
  CHECK(d.layer(0).dim == 4);
  CHECK(d.read_slice(0, 1, 1, 3).q == a.q);
}

TEST_CASE("a default layout with more heads than tokens is refused with the layout that fits", "[dump][layout]") {
  // [B=1, N=16, H=4, P=4] read as [B, H, N, P] would be 16 "heads" of 4 "tokens".
  const DumpArray bnhp = iota_array({1, 16, 4, 4});
  const std::string path = write_arrays("heads-first.h5", {{"q", bnhp}, {"k", bnhp}, {"v", bnhp}});
  CHECK_THAT(error_of([&] { Dump::open(path); }),
             Catch::Contains("16 heads of 4 tokens") && Catch::Contains("--layout bnhp"));
  const auto cli = run_attnprobe("info " + path);
  CHECK(cli.exit_code == 3);
  CHECK_THAT(cli.output, Catch::Contains("--layout bnhp"));
  DumpOptions options;
  options.layout = "bnhp";
  CHECK(Dump::open(path, options).layer(0).heads == 4);
  // An explicit layout is the user's word, even with more heads than tokens.
  options.layout = "bhnp";
  CHECK(Dump::open(path, options).layer(0).heads == 16);
  // Rank 3: [N, H, P] read as [H, N, P].
  const DumpArray nhp = iota_array({16, 4, 4});
  const std::string r3 = write_arrays("heads-first-3.h5", {{"q", nhp}, {"k", nhp}, {"v", nhp}});
  CHECK_THAT(error_of([&] { Dump::open(r3); }), Catch::Contains("--layout nhp"));
  // A decode dump's one query row is not its token count: 4 heads over a cache of 6 keys is sound.
  const std::string decode =
      write_arrays("decode-heads.h5",
                   {{"q", iota_array({1, 4, 1, 8})}, {"k", iota_array({1, 2, 6, 8})}, {"v", iota_array({1, 2, 6, 8})}});
  CHECK(Dump::open(decode).layer(0).heads == 4);
}

TEST_CASE("a layout without heads and a last dim of 128 or more needs --num-heads", "[dump][layout]") {
  // [N=6, H·P=128]: two heads of 64 side by side, or one of 128; the reader cannot tell which.
  const DumpArray flat = iota_array({6, 128});
  const std::string path = write_arrays("flat.h5", {{"q", flat}, {"k", flat}, {"v", flat}});
  CHECK_THAT(error_of([&] { Dump::open(path); }), Catch::Contains("one head of dim 128") &&
                                                      Catch::Contains("--num-heads H") &&
                                                      Catch::Contains("--num-heads 1"));
  const auto cli = run_attnprobe("info " + path);
  CHECK(cli.exit_code == 3);
  CHECK_THAT(cli.output, Catch::Contains("--num-heads"));
  DumpOptions one;
  one.num_heads = 1;  // "it really is one head"
  CHECK(Dump::open(path, one).layer(0).dim == 128);
  DumpOptions two;
  two.num_heads = 2;
  CHECK(Dump::open(path, two).layer(0).dim == 64);
  // An explicit headless layout does not say how wide a head is: still refused.
  const DumpArray bnp = iota_array({1, 6, 256});
  const std::string wide = write_arrays("flat-bnp.h5", {{"q", bnp}, {"k", bnp}, {"v", bnp}});
  DumpOptions headless;
  headless.layout = "bnp";
  CHECK_THAT(error_of([&] { Dump::open(wide, headless); }), Catch::Contains("--num-heads"));
  // Below 128 a single head is common (the small test dumps): read as before.
  const DumpArray narrow = iota_array({6, 64});
  CHECK(Dump::open(write_arrays("narrow.h5", {{"q", narrow}, {"k", narrow}, {"v", narrow}})).layer(0).dim == 64);
}

TEST_CASE("explicit q/k/v dataset paths read datasets anywhere", "[dump][layout]") {
  DumpContents c;
  DumpLayer g;
  g.name = "encoder";
  g.datasets = {{"queries", iota_array({4, 2})}, {"keys", iota_array({4, 2})}, {"values", iota_array({4, 2})}};
  c.layers.push_back(g);
  const std::string path = temp_path("paths.h5");
  write_dump(path, c, {});
  DumpOptions options;
  options.q_path = "/encoder/queries";
  options.k_path = "/encoder/keys";
  options.v_path = "/encoder/values";
  CHECK(Dump::open(path, options).read_slice(0, 0, 0, 4).n() == 4);
  options.v_path.clear();
  CHECK_THROWS_AS(Dump::open(path, options), UsageError);
}

TEST_CASE("the real pretrained dumps load", "[dump][shared]") {
  const std::string kwt = shared_data("kwt1-speech.h5"), stories = shared_data("stories260K.h5"),
                    sasrec = shared_data("sasrec-ml1m.h5");
  if (kwt.empty() || stories.empty() || sasrec.empty()) SKIP_TEST("../shared/data is not here");
  const Dump k = Dump::open(kwt);
  CHECK(k.layers().size() == 12);
  CHECK(k.layer(0).tokens == 99);
  CHECK(k.layer(0).dim == 64);
  CHECK(k.layer(0).scale == Approx(0.125));
  const Dump s = Dump::open(stories);
  CHECK(s.layers().size() == 5);
  CHECK(s.layer(4).heads == 8);
  CHECK(s.layer(4).dim == 8);
  CHECK(s.layer(0).causal.value_or(0) == 1);
  const HeadView view = s.read_slice(4, 7, 3, 512);
  CHECK(view.q.allFinite());
  const Dump r = Dump::open(sasrec);
  CHECK(r.layer(1).value_dim == 50);
}

TEST_CASE("bad files give input errors that say what and where", "[dump][errors]") {
  SECTION("missing file") {
    CHECK_THAT(error_of([] { Dump::open(temp_path("nope.h5")); }),
               Catch::Contains("cannot read") && Catch::Contains("nope.h5") && Catch::Contains("No such file"));
  }
  SECTION("not HDF5") {
    const std::string path = temp_path("text.h5");
    std::ofstream(path) << "dump,layer\n1,2\n";
    CHECK_THAT(error_of([&] { Dump::open(path); }), Catch::Contains("not an HDF5 file"));
  }
  SECTION("truncated") {
    const std::string full = write_synth("whole.h5", tiny(2, 2, 2, 64, 16));
    const std::string cut = temp_path("cut.h5");
    const std::string bytes = read_text(full);
    std::ofstream(cut, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
    const std::string message = error_of([&] {
      const Dump d = Dump::open(cut);
      for (const LayerInfo& l : d.layers()) d.read_slice(l.number, 0, 0, l.tokens);
    });
    CHECK_THAT(message, Catch::Contains("truncated"));
  }
  SECTION("no layers") {
    const std::string path = write_arrays("nolayer.h5", {});
    std::filesystem::remove(path);
    DumpContents c;
    c.layers.push_back(DumpLayer{"other", {{"x", iota_array({2, 2})}}, {}, {}, {}});
    write_dump(path, c, {});
    CHECK_THAT(error_of([&] { Dump::open(path); }), Catch::Contains("no layer_NN groups"));
  }
  SECTION("missing dataset") {
    const std::string path = write_arrays("nok.h5", {{"q", iota_array({2, 4, 3})}, {"v", iota_array({2, 4, 3})}});
    CHECK_THAT(error_of([&] { Dump::open(path); }), Catch::Contains("/layer_00/k") && Catch::Contains("keys"));
  }
  SECTION("wrong rank") {
    const std::string path = write_arrays(
        "rank5.h5",
        {{"q", iota_array({1, 1, 1, 4, 2})}, {"k", iota_array({1, 1, 1, 4, 2})}, {"v", iota_array({1, 1, 1, 4, 2})}});
    CHECK_THAT(error_of([&] { Dump::open(path); }), Catch::Contains("rank 5") && Catch::Contains("/layer_00/q"));
    const std::string mixed =
        write_arrays("mixed.h5", {{"q", iota_array({4, 2})}, {"k", iota_array({1, 4, 2})}, {"v", iota_array({4, 2})}});
    CHECK_THAT(error_of([&] { Dump::open(mixed); }), Catch::Contains("different ranks"));
  }
  SECTION("mismatched shapes") {
    // Fewer queries than keys is a decode dump (test_decode_dumps.cpp); more, without cross = 1, is refused.
    const std::string tokens = write_arrays(
        "tok.h5", {{"q", iota_array({2, 6, 4})}, {"k", iota_array({2, 5, 4})}, {"v", iota_array({2, 5, 4})}});
    CHECK_THAT(error_of([&] { Dump::open(tokens); }), Catch::Contains("6 tokens") && Catch::Contains("cross = 1"));
    const std::string kv_tokens = write_arrays(
        "kv-tok.h5", {{"q", iota_array({2, 5, 4})}, {"k", iota_array({2, 5, 4})}, {"v", iota_array({2, 6, 4})}});
    CHECK_THAT(error_of([&] { Dump::open(kv_tokens); }),
               Catch::Contains("tokens (k and v)") && Catch::Contains("[2, 6, 4]"));
    const std::string dims = write_arrays(
        "dim.h5", {{"q", iota_array({2, 5, 4})}, {"k", iota_array({2, 5, 3})}, {"v", iota_array({2, 5, 4})}});
    CHECK_THAT(error_of([&] { Dump::open(dims); }), Catch::Contains("head dim"));
    const std::string heads = write_arrays(
        "heads.h5", {{"q", iota_array({2, 5, 4})}, {"k", iota_array({3, 5, 4})}, {"v", iota_array({2, 5, 4})}});
    CHECK_THAT(error_of([&] { Dump::open(heads); }), Catch::Contains("heads"));
  }
  SECTION("NaN and Inf name layer, head, batch item and token") {
    DumpArray q = iota_array({2, 3, 6, 4});
    q.values[((1 * 3 + 2) * 6 + 4) * 4 + 1] = std::nan("");  // batch 1, head 2, token 4, column 1
    DumpArray k = iota_array({2, 3, 6, 4});
    k.values[((0 * 3 + 1) * 6 + 5) * 4 + 0] = INFINITY;  // batch 0, head 1, token 5
    const std::string path = write_arrays("nan.h5", {{"q", q}, {"k", k}, {"v", iota_array({2, 3, 6, 4})}});
    const Dump dump = Dump::open(path);
    CHECK_THAT(error_of([&] { dump.read_slice(0, 2, 1, 6); }),
               Catch::Contains("/layer_00/q") && Catch::Contains("nan") && Catch::Contains("layer 0") &&
                   Catch::Contains("head 2") && Catch::Contains("batch item 1") && Catch::Contains("token 4"));
    CHECK_THAT(error_of([&] { dump.read_slice(0, 1, 0, 6); }),
               Catch::Contains("/layer_00/k") && Catch::Contains("inf") && Catch::Contains("token 5"));
    CHECK_NOTHROW(dump.read_slice(0, 2, 1, 4));  // the prefix before the NaN is fine
    CHECK_NOTHROW(dump.read_slice(0, 0, 0, 6));
  }
  SECTION("bad scale attribute and bad lengths") {
    const std::string path = write_arrays(
        "scale.h5", {{"q", iota_array({4, 2})}, {"k", iota_array({4, 2})}, {"v", iota_array({4, 2})}}, -1.0);
    CHECK_THAT(error_of([&] { Dump::open(path); }), Catch::Contains("scale attribute"));
    DumpContents c;
    c.layers.push_back(
        DumpLayer{"layer_00",
                  {{"q", iota_array({2, 4, 2})}, {"k", iota_array({2, 4, 2})}, {"v", iota_array({2, 4, 2})}},
                  {},
                  {},
                  std::vector<int64_t>{4, 9}});
    // rank 3 = [H, N, P]: B = 1, so a lengths vector of 2 does not fit.
    const std::string lpath = temp_path("badlengths.h5");
    write_dump(lpath, c, {});
    CHECK_THAT(error_of([&] { Dump::open(lpath); }), Catch::Contains("lengths") && Catch::Contains("batch size 1"));
  }
  SECTION("integer datasets") {
    DumpContents c;
    c.layers.push_back(DumpLayer{
        "layer_00", {{"q", iota_array({4, 2})}, {"k", iota_array({4, 2})}, {"v", iota_array({4, 2})}}, {}, {}, {}});
    const std::string path = temp_path("int.h5");
    write_dump(path, c, {});
    // Replace v by an integer dataset with the HDF5 API directly.
    hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    H5Ldelete(f, "/layer_00/v", H5P_DEFAULT);
    hsize_t dims[2] = {4, 2};
    hid_t space = H5Screate_simple(2, dims, nullptr);
    hid_t ds = H5Dcreate2(f, "/layer_00/v", H5T_STD_I32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    H5Dclose(ds);
    H5Sclose(space);
    H5Fclose(f);
    CHECK_THAT(error_of([&] { Dump::open(path); }), Catch::Contains("not floating point"));
  }
}

TEST_CASE("out-of-range layer and head and batch item are input errors", "[dump][errors]") {
  const Dump dump = Dump::open(write_synth("range.h5", tiny()));
  CHECK_THAT(error_of([&] { dump.layer(7); }), Catch::Contains("no layer 7") && Catch::Contains("layers: 0,1"));
  CHECK_THAT(error_of([&] { dump.read_slice(0, 3, 0, 10); }), Catch::Contains("3 heads"));
  CHECK_THAT(error_of([&] { dump.read_slice(0, 0, 2, 10); }), Catch::Contains("2 batch items"));
  CHECK_THAT(error_of([&] { dump.read_slice(0, 0, 0, 41); }), Catch::Contains("40 valid tokens"));
  CHECK_THAT(error_of([&] { dump.read_slice(0, 0, 0, 0); }), Catch::Contains("length 0"));
}
