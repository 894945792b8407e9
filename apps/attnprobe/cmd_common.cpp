#include <fmt/format.h>

#include <charconv>

#include "attnprobe/common/error.h"
#include "attnprobe/common/text.h"
#include "commands.h"

namespace attnprobe::cli {

const CLI::Validator kAtLeastOne(
    [](const std::string& text) -> std::string {
      long long value = 0;
      const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
      if (error == std::errc() && end == text.data() + text.size() && value >= 1) return "";
      return "must be a whole number of at least 1, got '" + text + "'";
    },
    "INT>=1");

std::string suggest_options(const CLI::App& command) {
  std::vector<std::string> names;
  for (const CLI::Option* option : command.get_options()) {
    for (const std::string& name : option->get_lnames()) names.push_back("--" + name);
    for (const std::string& name : option->get_snames()) names.push_back("-" + name);
  }
  std::string hints;
  for (const std::string& arg : command.remaining()) {
    if (arg.size() < 2 || arg[0] != '-') continue;  // a value, or a stray positional: no option to suggest
    const std::string word = arg.substr(0, arg.find('='));
    if (const std::string name = nearest_name(word, names); !name.empty())
      hints += fmt::format(" Did you mean '{}' (for '{}')?", name, word);
  }
  return hints;
}

void add_dump_options(CLI::App& cmd, DumpOptions& options) {
  auto* group = "Dump layout (for files that are not /layer_NN/{q,k,v} [B,H,N,P])";
  cmd.add_option("--q-path", options.q_path,
                 "dataset path (HDF5) or tensor name (safetensors, .npz) of the queries, e.g. /attn/q (with --k-path, "
                 "--v-path)")
      ->group(group);
  cmd.add_option("--k-path", options.k_path, "dataset path of the keys")->group(group);
  cmd.add_option("--v-path", options.v_path, "dataset path of the values")->group(group);
  cmd.add_option("--layout", options.layout,
                 "dimension order: bhnp (default for rank 4), bnhp, hnp (rank 3), nhp, bnp, np (rank 2); "
                 "b batch, h heads, n tokens, p head dim")
      ->group(group);
  cmd.add_option("--num-heads", options.num_heads,
                 "split the last dimension into this many heads (for [B,N,H*P] use --layout bnp --num-heads H)")
      ->check(kAtLeastOne)
      ->group(group);
}

}  // namespace attnprobe::cli
