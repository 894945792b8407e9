// List parsing (--lengths, --samples, --layers) and the CSV field quoting.
#include "attnprobe/common/error.h"
#include "attnprobe/common/text.h"
#include "attnprobe/records/csv.h"
#include "support.h"

using namespace attnprobe;
using namespace attnprobe::test;

TEST_CASE("integer lists accept values and ranges and doubling and stepped ranges", "[text]") {
  using V = std::vector<int64_t>;
  CHECK(parse_int_list("8,16,32", "x") == V{8, 16, 32});
  CHECK(parse_int_list("3..6", "x") == V{3, 4, 5, 6});
  CHECK(parse_int_list("8..128:x2", "x") == V{8, 16, 32, 64, 128});
  CHECK(parse_int_list("8..100:x2", "x") == V{8, 16, 32, 64});
  CHECK(parse_int_list("0..12:+4", "x") == V{0, 4, 8, 12});
  CHECK(parse_int_list(" 1, 5..6 ,9", "x") == V{1, 5, 6, 9});
}

TEST_CASE("malformed lists are usage errors that say how to write one", "[text]") {
  for (const char* bad : {"", "8,,16", "a", "8..", "16..8", "8..128:x1", "8..128:y2", "-3", "0..8:x2"}) {
    INFO(bad);
    CHECK_THROWS_AS(parse_int_list(bad, "--lengths"), UsageError);
  }
  CHECK_THROWS_WITH(parse_int_list("8..", "--lengths"), Catch::Contains("--lengths") && Catch::Contains("8..128:x2"));
}

TEST_CASE("CSV fields with commas and quotes round-trip", "[text]") {
  const std::string spec = "yoso(m=32,tau=8,hash=\"gauss\")";
  const std::string line = csv_field("a") + "," + csv_field(spec) + "," + csv_field("");
  const auto fields = parse_csv_line(line);
  REQUIRE(fields.size() == 3);
  CHECK(fields[0] == "a");
  CHECK(fields[1] == spec);
  CHECK(fields[2] == "");
  CHECK_THROWS_AS(parse_csv_line("\"open"), InputError);
}

TEST_CASE("numbers are written to round-trip exactly", "[text]") {
  for (double v : {0.1, 1.0 / 3.0, 1e-300, 123456789.123456789, -2.5e-7}) {
    double back;
    REQUIRE(parse_real(format_real(v), back));
    CHECK(back == v);
  }
  CHECK(format_real(std::nan("")) == "nan");
}

TEST_CASE("edit distance ignores case and counts a swap of neighbours as one edit", "[text][did-you-mean]") {
  CHECK(edit_distance("performr", "performer") == 1);
  CHECK(edit_distance("m", "M") == 0);
  CHECK(edit_distance("--trails", "--trials") == 1);  // a swap, not two substitutions
  CHECK(edit_distance("", "abc") == 3);
  CHECK(edit_distance("kitten", "sitting") == 3);
}

TEST_CASE("did you mean suggests only a near name", "[text][did-you-mean]") {
  const std::vector<std::string> keys = {"M", "features", "ortho"};
  CHECK(nearest_name("m", keys) == "M");
  CHECK(nearest_name("featurs", keys) == "features");
  CHECK(nearest_name("x", keys).empty());  // one letter from M, but nothing of the word would remain
  CHECK(nearest_name("bogus", keys).empty());
  CHECK(nearest_name("--length", {"--lengths", "--layers"}) == "--lengths");
  CHECK(did_you_mean("performr", {"yoso", "performer"}) == " Did you mean 'performer'?");
  CHECK(did_you_mean("zzz", {"yoso", "performer"}).empty());
}

TEST_CASE("fnv1a is the 64-bit FNV-1a that run.json's plan fingerprints were written with", "[text]") {
  // Published FNV-1a 64 test vectors: "" is the offset basis, "a" is 0xaf63dc4c8601ec8c.
  CHECK(fnv1a("") == 0xcbf29ce484222325ULL);
  CHECK(fnv1a("a") == 0xaf63dc4c8601ec8cULL);
  CHECK(fnv1a("foobar") == 0x85944171f73967e8ULL);
  // Continuing from a state hashes a text in parts as in one piece (the dump digest reads 1 MiB at a time).
  CHECK(fnv1a("bar", fnv1a("foo")) == fnv1a("foobar"));
}
