// plots/palette.csv, the one list of estimator colours the figures (plots/style.py) and the report share (CMake reads
// it into the build): every registered estimator has a colour, no two share one, and a report page colours a name
// the file does not list apart from every listed one beside it.
#include <algorithm>
#include <cctype>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "attnprobe/estimators/registry.h"
#include "attnprobe/report/html/svg_chart.h"
#include "support.h"

using namespace attnprobe;

namespace {

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
  return text;
}

// What `attnprobe list` prints: the library's estimators, without those the test files register (families "test"
// and "test-bad"), which no figure or report of the project draws.
std::set<std::string> registered_names() {
  std::set<std::string> names;
  for (const EstimatorDef* def : registered_estimators())
    if (def->family.rfind("test", 0) != 0) names.insert(def->name);
  return names;
}

}  // namespace

TEST_CASE("palette: every registered estimator has one colour of its own", "[palette]") {
  const std::vector<std::pair<std::string, std::string>> rows = estimator_palette();
  std::map<std::string, std::string> colour_of;
  std::map<std::string, std::string> owner_of_colour;  // lower-case colour -> the first name with it
  for (const auto& [name, colour] : rows) {
    INFO("plots/palette.csv row " << name << "," << colour);
    CHECK(colour_of.emplace(name, colour).second);  // a name listed twice
    const auto [owner, fresh] = owner_of_colour.emplace(lower(colour), name);
    INFO("the colour is " << owner->second << "'s already");
    CHECK(fresh);
  }
  const std::set<std::string> registered = registered_names();
  std::vector<std::string> missing, unknown;
  for (const std::string& name : registered)
    if (!colour_of.count(name)) missing.push_back(name);
  for (const auto& [name, colour] : colour_of)
    if (!registered.count(name)) unknown.push_back(name);
  INFO("estimators without a row in plots/palette.csv: " << fmt::format("{}", fmt::join(missing, ", ")));
  CHECK(missing.empty());
  INFO("rows of plots/palette.csv that name no registered estimator: " << fmt::format("{}", fmt::join(unknown, ", ")));
  CHECK(unknown.empty());
}

TEST_CASE("palette: a report page colours listed names by the file and other names apart from them", "[palette]") {
  std::set<std::string> names = registered_names();
  names.insert({"py:custom", "py:other", "py:third"});
  const std::map<std::string, std::string> colours = estimator_colours(names);
  REQUIRE(colours.size() == names.size());
  for (const auto& [name, colour] : estimator_palette()) CHECK(colours.at(name) == colour);
  std::set<std::string> distinct;
  for (const auto& [name, colour] : colours) distinct.insert(lower(colour));
  CHECK(distinct.size() == names.size());
  // A page with one custom estimator beside one listed one: the index palette's first colour.
  CHECK(estimator_colours({"py:custom", "vmean"}).at("py:custom") == palette_colour(0));
}
