// Dumps (docs/dumps.md) independent of their container: which layers a file holds, how each
// array's dimensions map to (batch, head, token, feature) under a layout, grouped-query K/V (query
// head h reads kv head h / (H / Hkv)), valid lengths, the scale and causal attributes, and the
// checked reading of one slice. The container (HDF5, safetensors, .npz; container.h) only stores
// named arrays. Opening reads shapes and attributes; read_slice reads one head's prefix (cost
// O(n · (2P + Pv)) values read and checked).
#include "attnprobe/io/dump.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>

#include "attnprobe/common/digest.h"
#include "attnprobe/common/error.h"
#include "attnprobe/common/text.h"
#include "attnprobe/io/container.h"

namespace attnprobe {

namespace {

// What the user should read when a dump does not have the expected shape.
constexpr const char* kLayoutHint =
    "attnprobe expects layer_NN q, k, v of shape [B, H, N, P] (k, v: [B, Hkv, N, P|Pv]; or [H, N, P], [N, P]); "
    "other layouts are read with --layout and --q-path/--k-path/--v-path (see `attnprobe info --help`)";

std::string shape_text(const std::vector<int64_t>& dims) { return fmt::format("[{}]", fmt::join(dims, ", ")); }

// The layer groups (layer_<digits>) sorted by number; an out-of-range number or two names for one
// layer are input errors.
std::vector<std::pair<int, std::string>> numbered_groups(const Container& container, const std::string& path) {
  std::vector<std::pair<int, std::string>> groups;
  for (const std::string& name : container.layer_groups()) {
    int number = 0;
    const char* digits = name.data() + 6;
    const auto [end, ec] = std::from_chars(digits, name.data() + name.size(), number);
    require_input(ec == std::errc() && end == name.data() + name.size(),
                  "'{}': the group {} names a layer number beyond {}; rename it (layer_0 .. layer_{}).", path, name,
                  std::numeric_limits<int>::max(), std::numeric_limits<int>::max());
    groups.emplace_back(number, name);
  }
  std::sort(groups.begin(), groups.end());
  for (size_t i = 1; i < groups.size(); ++i)
    require_input(groups[i].first != groups[i - 1].first,
                  "'{}': the groups {} and {} both name layer {} (the number is the value of the digits); keep one "
                  "or rename the other.",
                  path, groups[i - 1].second, groups[i].second, groups[i].first);
  return groups;
}

std::string default_layout(size_t rank) {
  switch (rank) {
    case 4:
      return "bhnp";
    case 3:
      return "hnp";
    case 2:
      return "np";
    default:
      return "";
  }
}

bool valid_layout(const std::string& layout) {
  static const char* kLayouts[] = {"bhnp", "bnhp", "hnp", "nhp", "bnp", "np"};
  return std::find(std::begin(kLayouts), std::end(kLayouts), layout) != std::end(kLayouts);
}

// Size of dimension `letter` in `dims` interpreted with `layout`; 1 if the layout lacks it.
int64_t dim_of(const std::vector<int64_t>& dims, const std::string& layout, char letter) {
  size_t pos = layout.find(letter);
  return pos == std::string::npos ? 1 : dims[pos];
}

// The attributes of a layer's geometry (docs/dumps.md, "Queries ≠ keys"): `cross` and `window`, and what
// they may not be combined with; checked once q/k/v's token counts are known.
void read_geometry_attributes(const Container& c, const std::string& path, LayerInfo& info) {
  if (const auto cross = c.number_attribute(info.group, "cross")) {
    require_input(*cross == 0 || *cross == 1, "'{}' {}: the cross attribute is {}; it must be 0 or 1.", path, info.name,
                  *cross);
    info.cross = *cross == 1;
  }
  if (const auto window = c.number_attribute(info.group, "window")) {
    require_input(*window >= 1 && *window == std::floor(*window) && *window <= 1e15,
                  "'{}' {}: the window attribute is {}; it must be a whole number of keys W >= 1 (a query at position "
                  "t sees keys t-W+1..t).",
                  path, info.name, *window);
    require_input(info.causal.value_or(0) == 1,
                  "'{}' {}: the window attribute ({}) needs causal = 1 as well (a sliding window is a causal mask "
                  "that also forgets keys older than W); set causal = 1, or remove window.",
                  path, info.name, *window);
    info.window = static_cast<int64_t>(*window);
  }
  require_input(!(info.cross && info.causal.value_or(0)),
                "'{}' {}: cross = 1 and causal = 1 contradict each other: cross-attention queries have no position "
                "among the keys, so only the full mask applies. Remove one of the two attributes.",
                path, info.name);
  require_input(info.cross || info.tokens <= info.key_tokens,
                "'{}' {}: q has {} tokens but k and v only {}. Each query needs a position among the keys: a decode "
                "dump stores the last Nq <= Nk queries with the whole cache. If this is cross-attention (queries from "
                "another sequence), set the layer's attribute cross = 1.",
                path, info.name, info.tokens, info.key_tokens);
}

// layer_NN/q_positions: integer [Nq] (every batch item) or [B, Nq], strictly increasing, each below the item's
// valid keys. Read after the lengths, which bound them.
void read_query_positions(const Container& c, const std::string& path, LayerInfo& info) {
  const std::string name = c.member_name(info.group, "q_positions");
  if (!c.has_tensor(name)) {
    for (int64_t b = 0; b < info.batch; ++b)
      require_input(!info.own_queries() || info.cross || info.lengths[b] >= info.tokens,
                    "'{}' {}: batch item {} has {} valid keys, fewer than its {} query rows, so the queries cannot be "
                    "the last {} tokens of the cache (bottom-right alignment). Give their positions in {} or fix the "
                    "lengths.",
                    path, info.name, b, info.lengths[b], info.tokens, info.tokens, name);
    return;
  }
  require_input(!info.cross,
                "'{}': {} gives query positions, but the layer is cross-attention (cross = 1), whose queries have no "
                "position among the keys. Remove one of the two.",
                path, name);
  const TensorInfo t = c.tensor(name);
  const bool per_item = t.shape.size() == 2;
  require_input(t.integer && (t.shape == std::vector<int64_t>{info.tokens} ||
                              t.shape == std::vector<int64_t>{info.batch, info.tokens}),
                "'{}': {} must be an integer array [{}] or [{}, {}] (a position per query row, per batch item or for "
                "all), but it is {} {}.",
                path, name, info.tokens, info.batch, info.tokens, t.dtype, shape_text(t.shape));
  std::vector<double> values(static_cast<size_t>(per_item ? info.batch * info.tokens : info.tokens));
  c.read(name, per_item ? std::vector<int64_t>{0, 0} : std::vector<int64_t>{0}, t.shape, values.data());
  info.q_positions.assign(info.batch, {});
  for (int64_t b = 0; b < info.batch; ++b) {
    std::vector<int64_t>& positions = info.q_positions[b];
    for (int64_t i = 0; i < info.tokens; ++i) {
      const double t_i = values[static_cast<size_t>((per_item ? b * info.tokens : 0) + i)];
      require_input(t_i >= 0 && t_i < static_cast<double>(info.lengths[b]),
                    "'{}': {}[{}{}] = {} is not a position among batch item {}'s {} valid keys (0..{}).", path, name,
                    per_item ? fmt::format("{}, ", b) : "", i, t_i, b, info.lengths[b], info.lengths[b] - 1);
      require_input(positions.empty() || t_i > static_cast<double>(positions.back()),
                    "'{}': {} must increase strictly along the query rows (row i + 1 comes after row i), but row {} "
                    "is at {} after {}{}.",
                    path, name, i, t_i, positions.empty() ? 0 : positions.back(),
                    per_item ? fmt::format(" in batch item {}", b) : "");
      positions.push_back(static_cast<int64_t>(t_i));
    }
  }
}

// The score shaping of a layer (docs/dumps.md, "Score shaping"): the soft-cap attributes, ALiBi slopes per query
// head and an additive bias broadcast over batch items and heads; checked once the geometry is known.
void read_score_shaping(const Container& c, const std::string& path, LayerInfo& info) {
  if (const auto softcap = c.number_attribute(info.group, "softcap")) {
    require_input(std::isfinite(*softcap) && *softcap >= 0,
                  "'{}' {}: the softcap attribute is {}; it must be a positive number c (scores become c*tanh(S/c)), "
                  "or 0 for none.",
                  path, info.name, *softcap);
    info.softcap = *softcap;
  }
  if (const auto first = c.number_attribute(info.group, "bias_before_softcap")) {
    require_input(*first == 0 || *first == 1, "'{}' {}: the bias_before_softcap attribute is {}; it must be 0 or 1.",
                  path, info.name, *first);
    info.bias_before_softcap = *first == 1;
  }
  const std::string slopes = c.member_name(info.group, "alibi_slopes");
  if (c.has_tensor(slopes)) {
    const TensorInfo t = c.tensor(slopes);
    require_input(t.floating && t.shape == std::vector<int64_t>{info.heads},
                  "'{}': {} must be a floating-point vector of one ALiBi slope per query head [{}], but it is {} {}.",
                  path, slopes, info.heads, t.dtype, shape_text(t.shape));
    require_input(!info.cross,
                  "'{}': {} gives ALiBi slopes, a bias by distance between query and key positions, but the layer is "
                  "cross-attention (cross = 1), whose queries have no positions. Store the bias itself as {} instead.",
                  path, slopes, c.member_name(info.group, "bias"));
    info.alibi_slopes.resize(static_cast<size_t>(info.heads));
    c.read(slopes, {0}, t.shape, info.alibi_slopes.data());
    for (int64_t h = 0; h < info.heads; ++h)
      require_input(std::isfinite(info.alibi_slopes[h]) && std::fabs(info.alibi_slopes[h]) <= 1e6,
                    "'{}': {}[{}] = {} is not a usable ALiBi slope (finite, at most 1e6 in size).", path, slopes, h,
                    info.alibi_slopes[h]);
  }
  const std::string bias = c.member_name(info.group, "bias");
  if (c.has_tensor(bias)) {
    const TensorInfo t = c.tensor(bias);
    const std::vector<int64_t>& d = t.shape;
    const size_t rank = d.size();
    const bool fits = t.floating && rank >= 2 && rank <= 4 && d[rank - 2] == info.tokens &&
                      d[rank - 1] == info.key_tokens && (rank < 3 || d[rank - 3] == 1 || d[rank - 3] == info.heads) &&
                      (rank < 4 || d[0] == 1 || d[0] == info.batch);
    require_input(fits,
                  "'{}': {} must be a floating-point additive bias of shape [Nq, Nk], [H, Nq, Nk] or [B, H, Nq, Nk] "
                  "(a 1 in place of B or H applies to every batch item or head) with Nq = {} query rows and Nk = {} "
                  "keys, but it is {} {}.",
                  path, bias, info.tokens, info.key_tokens, t.dtype, shape_text(d));
    info.bias_path = bias;
    info.bias_shape = d;
  }
}

// The rotary frequencies of a layer (docs/dumps.md, "Rotary frequencies"): layer_NN/rope_inv_freq, one inverse
// frequency θ_f per pair of channels, and the root attribute rope_layout naming the pairing (only "half", Hugging
// Face's rotate_half: channels f and f + P/2); what undoes the rotation of the dumped queries (expected(stats=rope)).
void read_rotary_frequencies(const Container& c, const std::string& path, LayerInfo& info) {
  const std::string name = c.member_name(info.group, "rope_inv_freq");
  if (!c.has_tensor(name)) return;
  const TensorInfo t = c.tensor(name);
  require_input(info.dim % 2 == 0 && t.floating && t.shape == std::vector<int64_t>{info.dim / 2},
                "'{}': {} must be a floating-point vector of one inverse frequency per pair of channels [{}] (head "
                "dim {}), but it is {} {}.",
                path, name, info.dim / 2, info.dim, t.dtype, shape_text(t.shape));
  const std::string layout = c.string_attribute("rope_layout");
  require_input(layout == "half",
                "'{}': {} gives rotary frequencies, but the root attribute rope_layout is {}: attnprobe reads the "
                "pairing of Hugging Face's rotate_half (channel f with f + {}), written rope_layout = \"half\". "
                "Permute an interleaved model's channels to that pairing, or leave the frequencies out.",
                path, name, layout.empty() ? "missing" : "'" + layout + "'", info.dim / 2);
  require_input(!info.cross,
                "'{}': {} gives rotary frequencies, but the layer is cross-attention (cross = 1), whose queries have "
                "no positions to rotate by. Leave them out of this layer.",
                path, name);
  auto frequencies = std::make_shared<std::vector<double>>(static_cast<size_t>(info.dim / 2));
  c.read(name, {0}, t.shape, frequencies->data());
  const std::string problem = rotary_frequencies_problem(*frequencies, info.dim);
  require_input(problem.empty(), "'{}': {}{}.", path, name, problem);
  info.rope_inv_freq = std::move(frequencies);
}

}  // namespace

Dump Dump::open(const std::string& path, const DumpOptions& options) {
  if (std::error_code ec; std::filesystem::is_directory(path, ec))
    throw InputError(fmt::format("'{}' is a directory, not a dump: give the path of the dump file.", path));
  if (FILE* f = std::fopen(path.c_str(), "rb")) {
    std::fclose(f);
  } else {
    throw InputError(
        fmt::format("cannot read '{}': {}. Check the path (and permissions).", path, std::strerror(errno)));
  }
  const bool explicit_paths = !options.q_path.empty() || !options.k_path.empty() || !options.v_path.empty();
  if (explicit_paths && (options.q_path.empty() || options.k_path.empty() || options.v_path.empty()))
    throw UsageError("--q-path, --k-path and --v-path go together: give all three");
  if (!options.layout.empty() && !valid_layout(options.layout))
    throw UsageError(fmt::format("unknown --layout '{}': use one of bhnp, bnhp, hnp, nhp, bnp, np", options.layout));

  Dump dump;
  dump.path_ = path;
  dump.num_heads_split_ = options.num_heads;
  dump.container_ = open_container(path);
  const Container& c = *dump.container_;
  dump.format_ = c.format();

  // Each candidate: its group ("" = root) and the names of its q, k, v.
  std::vector<LayerInfo> candidates;
  if (explicit_paths) {
    LayerInfo info;
    info.group = c.group_of(options.q_path);
    info.name = info.group.empty() ? "/" : info.group;
    info.q_path = options.q_path;
    info.k_path = options.k_path;
    info.v_path = options.v_path;
    candidates.push_back(info);
  } else {
    for (auto& [number, name] : numbered_groups(c, path)) {
      LayerInfo info;
      info.number = number;
      info.name = info.group = name;
      candidates.push_back(info);
    }
    if (candidates.empty()) {
      require_input(c.has_tensor(c.member_name("", "q")),
                    "'{}' ({}) has no layer_NN groups and no q/k/v at its root. {}.", path, c.format(), kLayoutHint);
      candidates.push_back(LayerInfo{.name = "/"});
    }
    for (LayerInfo& info : candidates) {
      info.q_path = c.member_name(info.group, "q");
      info.k_path = c.member_name(info.group, "k");
      info.v_path = c.member_name(info.group, "v");
    }
  }

  for (LayerInfo& info : candidates) {
    auto shape_of = [&](const std::string& tensor, const char* role) {
      require_input(c.has_tensor(tensor), "'{}' has no {} {} (the {} of {}). {}.", path, c.noun(), tensor, role,
                    info.name, kLayoutHint);
      const TensorInfo t = c.tensor(tensor);
      require_input(t.floating, "'{}': {} is {}, not floating point; attnprobe reads bfloat16/float16/32/64 {}.", path,
                    tensor, t.dtype, role);
      if (tensor == info.q_path) {
        info.dtype = t.dtype;
        info.compressed = t.compressed;
      }
      return t.shape;
    };
    const auto qs = shape_of(info.q_path, "queries");
    const auto ks = shape_of(info.k_path, "keys");
    const auto vs = shape_of(info.v_path, "values");
    if (qs.size() != ks.size() || qs.size() != vs.size())
      throw InputError(fmt::format("'{}' {}: q, k and v ({} {}, {} {}, {} {}) have different ranks. {}.", path,
                                   info.name, info.q_path, shape_text(qs), info.k_path, shape_text(ks), info.v_path,
                                   shape_text(vs), kLayoutHint));
    // A scalar (rank 0) matched the empty layout of its rank and was read as one 1 × 1 slice.
    require_input(qs.size() >= 2, "'{}' {}: q has rank {} (shape {}); queries need at least tokens × head dim. {}.",
                  path, info.q_path, qs.size(), shape_text(qs), kLayoutHint);
    info.layout = options.layout.empty() ? default_layout(qs.size()) : options.layout;
    if (info.layout.size() != qs.size())
      throw InputError(fmt::format("'{}' {}: q has rank {} (shape {}), which the layout '{}' does not fit. {}.", path,
                                   info.q_path, qs.size(), shape_text(qs),
                                   info.layout.empty() ? "(none for this rank)" : info.layout, kLayoutHint));
    for (auto* dims : {&qs, &ks, &vs})
      for (int64_t d : *dims) {
        require_input(d != 0, "'{}' {}: a {} has an empty dimension ({}).", path, info.name, c.noun(),
                      shape_text(*dims));
        require_input(d <= std::numeric_limits<int>::max(),
                      "'{}' {}: a dimension of {} is beyond {} (the largest batch, head or token count attnprobe "
                      "reads).",
                      path, info.name, shape_text(*dims), std::numeric_limits<int>::max());
      }
    info.batch = dim_of(qs, info.layout, 'b');
    info.heads = dim_of(qs, info.layout, 'h');
    info.kv_heads = dim_of(ks, info.layout, 'h');
    info.tokens = dim_of(qs, info.layout, 'n');
    info.key_tokens = dim_of(ks, info.layout, 'n');
    info.dim = dim_of(qs, info.layout, 'p');
    info.value_dim = dim_of(vs, info.layout, 'p');
    // A [B, N, H, P] file read as [B, H, N, P] runs without complaint as N "heads" of H "tokens": refuse
    // the default layout when it makes more heads than (key) tokens. An explicit --layout is the user's word.
    if (options.layout.empty() && info.layout.find('h') != std::string::npos)
      require_input(info.heads <= info.key_tokens,
                    "'{}' {}: read with the default layout {}, q {} has {} heads of {} tokens (k: {}). More heads than "
                    "tokens is most likely a file whose tokens come before its heads: read it with --layout {}, or, "
                    "if the axes really are {}, say so with --layout {}.",
                    path, info.name, info.layout, shape_text(qs), info.heads, info.tokens, info.key_tokens,
                    info.layout == "bhnp" ? "bnhp" : "nhp", info.layout, info.layout);
    auto mismatch = [&](const char* what) {
      return InputError(
          fmt::format("'{}' {}: q {}, k {} and v {} do not match in {} (layout {}). q/k/v must share "
                      "batch, k/v their heads and tokens, and q/k the head dim.",
                      path, info.name, shape_text(qs), shape_text(ks), shape_text(vs), what, info.layout));
    };
    if (dim_of(ks, info.layout, 'b') != info.batch || dim_of(vs, info.layout, 'b') != info.batch)
      throw mismatch("batch");
    if (dim_of(vs, info.layout, 'h') != info.kv_heads) throw mismatch("heads (k and v)");
    require_input(info.heads % info.kv_heads == 0,
                  "'{}' {}: q has {} heads and k/v {}, but grouped-query attention needs the query heads H to be a "
                  "multiple of the kv heads Hkv (query head h reads kv head h / (H / Hkv)). Check the head "
                  "dimension of the layout ({}).",
                  path, info.name, info.heads, info.kv_heads, info.layout);
    if (options.num_heads > 0) {
      if (info.layout.find('h') != std::string::npos)
        throw UsageError(
            fmt::format("--num-heads splits the last dimension into heads, but layout '{}' already has "
                        "a head dimension; use --layout bnp or np",
                        info.layout));
      if (info.dim % options.num_heads || info.value_dim % options.num_heads)
        throw InputError(fmt::format("'{}' {}: the last dimensions ({} for q/k, {} for v) do not split into {} heads.",
                                     path, info.name, info.dim, info.value_dim, options.num_heads));
      info.heads = info.kv_heads = options.num_heads;
      info.dim /= options.num_heads;
      info.value_dim /= options.num_heads;
    }
    // A flat [B, N, H·P] file read without --num-heads is measured as one head of dim H·P. Nothing in
    // the shape tells one head of 128 from two of 64, and a model's hidden width (≥ 128) is the likelier
    // reading of a headless dump, so one wide head is read only when asked for with --num-heads 1.
    constexpr int64_t kWideHeadDim = 128;
    require_input(
        info.layout.find('h') != std::string::npos || options.num_heads > 0 || info.dim < kWideHeadDim,
        "'{}' {}: layout {} has no head axis, so q {} would be read as one head of dim {}, which is most "
        "likely H heads of dim P side by side ([.., N, H·P]). Give their number with --num-heads H (H·P = {}); "
        "if it really is one head, say so with --num-heads 1.",
        path, info.name, info.layout, shape_text(qs), info.dim, info.dim);
    if (dim_of(ks, info.layout, 'p') != dim_of(qs, info.layout, 'p')) throw mismatch("head dim");
    if (dim_of(vs, info.layout, 'n') != info.key_tokens) throw mismatch("tokens (k and v)");

    if (auto scale = c.number_attribute(info.group, "scale")) {
      if (!std::isfinite(*scale) || *scale <= 0)
        throw InputError(
            fmt::format("'{}' {}: the scale attribute is {}, but it must be a positive finite number "
                        "(remove it to use 1/sqrt(P)).",
                        path, info.name, *scale));
      info.scale = *scale;
      info.scale_from_file = true;
    } else {
      info.scale = 1.0 / std::sqrt(static_cast<double>(info.dim));
    }
    if (auto causal = c.number_attribute(info.group, "causal")) {
      require_input(*causal == 0 || *causal == 1, "'{}' {}: the causal attribute is {}; it must be 0 or 1.", path,
                    info.name, *causal);
      info.causal = static_cast<int>(*causal);
    }
    read_geometry_attributes(c, path, info);
    read_score_shaping(c, path, info);
    read_rotary_frequencies(c, path, info);

    // Optional real upstream gradients of the attention output: one per query head, [B, H, N, Pv]
    // (v's shape with q's heads; docs/dumps.md).
    const std::string dy_path = c.member_name(info.group, "dy");
    if (!explicit_paths && c.has_tensor(dy_path)) {
      const auto dys = shape_of(dy_path, "upstream gradients");
      std::vector<int64_t> expected = vs;
      if (const size_t h = info.layout.find('h'); h != std::string::npos) expected[h] = dim_of(qs, info.layout, 'h');
      if (const size_t n = info.layout.find('n'); n != std::string::npos) expected[n] = info.tokens;
      if (dys != expected)
        throw InputError(
            fmt::format("'{}': {} has shape {}, but it must have the shape of v with the query heads, {} (upstream "
                        "gradients of the attention output). Fix or remove it.",
                        path, dy_path, shape_text(dys), shape_text(expected)));
      info.dy_path = dy_path;
    }

    info.lengths.assign(info.batch, info.key_tokens);
    const std::string lengths_path = c.member_name(info.group, "lengths");
    if (c.has_tensor(lengths_path)) {
      const TensorInfo t = c.tensor(lengths_path);
      if (t.shape.size() != 1 || t.shape[0] != info.batch || !t.integer)
        throw InputError(fmt::format("'{}': {} must be an integer vector of the batch size {} (it is {} {}).", path,
                                     lengths_path, info.batch, t.dtype, shape_text(t.shape)));
      std::vector<double> values(info.batch);
      c.read(lengths_path, {0}, {info.batch}, values.data());
      for (int64_t b = 0; b < info.batch; ++b) {
        if (!(values[b] >= 1 && values[b] <= static_cast<double>(info.key_tokens)))
          throw InputError(fmt::format("'{}': {}[{}] = {} is outside 1..{} (the keys' token count).", path,
                                       lengths_path, b, values[b], info.key_tokens));
        info.lengths[b] = static_cast<int64_t>(values[b]);
      }
      info.has_lengths = true;
    }
    read_query_positions(c, path, info);
    dump.layers_.push_back(std::move(info));
  }
  return dump;
}

const LayerInfo& Dump::layer(int number) const {
  for (const LayerInfo& info : layers_)
    if (info.number == number) return info;
  std::vector<std::string> have;
  for (const LayerInfo& info : layers_) have.push_back(std::to_string(info.number));
  throw InputError(fmt::format("'{}' has no layer {} (layers: {}).", path_, number, fmt::join(have, ",")));
}

std::string Dump::root_attribute(const std::string& name) const { return container_->string_attribute(name); }

std::string Dump::fingerprint() const {
  // How the bytes are read: --layout, --num-heads and explicit paths change this, not the file.
  std::string reading;
  for (const LayerInfo& l : layers_)
    reading += fmt::format("{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{:a}|{}|{}|{}\n", l.name, l.q_path, l.k_path, l.v_path,
                           l.layout, l.dtype, l.batch, l.heads, l.kv_heads, l.tokens, l.key_tokens, l.scale, l.dim,
                           l.value_dim, num_heads_split_);
  // Score shaping changes the slices' reference without changing q, k, v; a layer without it reads as before.
  for (const LayerInfo& l : layers_)
    if (l.shaped())
      reading += fmt::format("{}|softcap {:a}|{}|alibi {}|bias {}\n", l.name, l.softcap, l.bias_before_softcap,
                             fmt::join(l.alibi_slopes, ","), l.bias_path);
  return fmt::format("{}, read as {:016x}", file_digest(path_), fnv1a(reading));
}

void Dump::read_block(const std::string& tensor, const LayerInfo& info, int head, int batch, int64_t n, int64_t width,
                      MatrixD& out) const {
  const size_t rank = info.layout.size();
  std::vector<int64_t> start(rank), count(rank);
  for (size_t d = 0; d < rank; ++d) {
    switch (info.layout[d]) {
      case 'b':
        start[d] = batch;
        count[d] = 1;
        break;
      case 'h':
        start[d] = head;
        count[d] = 1;
        break;
      case 'n':
        start[d] = 0;
        count[d] = n;
        break;
      case 'p':
        start[d] = num_heads_split_ > 0 ? head * width : 0;
        count[d] = width;
        break;
    }
  }
  out.resize(n, width);  // row-major, as the block is read (every layout ends in p)
  container_->read(tensor, start, count, out.data());
  if (const auto [i, c] = first_non_finite(out); i >= 0)
    throw InputError(fmt::format(
        "'{}': {} has a non-finite value ({}) at layer {}, head {}, batch item {}, token {}, column {}. Fix the "
        "dump (e.g. an overflow in float16?) or leave this slice out with --layers/--heads/--batch.",
        path_, tensor, out(i, c), info.number, head, batch, i, c));
}

const LayerInfo& Dump::checked_slice(int layer_number, int head, int batch, int64_t n) const {
  const LayerInfo& info = layer(layer_number);
  if (head < 0 || head >= info.heads)
    throw InputError(
        fmt::format("'{}' layer {} has {} heads; head {} does not exist.", path_, info.number, info.heads, head));
  if (batch < 0 || batch >= info.batch)
    throw InputError(fmt::format("'{}' layer {} has {} batch items; item {} does not exist.", path_, info.number,
                                 info.batch, batch));
  const int64_t valid = info.lengths[batch];
  if (n < 1 || n > valid)
    throw InputError(
        fmt::format("length {} asked for '{}' layer {} batch item {}, which has {} valid tokens{}. Use "
                    "lengths in 1..{} (a length L takes the first L tokens).",
                    n, path_, info.number, batch, valid, info.has_lengths ? " (from its lengths dataset)" : "", valid));
  // A layer with its own query rows is read whole: every query against the item's whole valid cache.
  require_input(!info.own_queries() || n == valid,
                "length {} asked for '{}' layer {} batch item {}, which stores its own {} query rows against {} keys: "
                "its cases use the whole cache (a shorter prefix would leave queries without their keys).",
                n, path_, info.number, batch, info.tokens, valid);
  return info;
}

MatrixD Dump::read_queries(int layer_number, int head, int batch, int64_t n) const {
  const LayerInfo& info = checked_slice(layer_number, head, batch, n);
  MatrixD q;
  read_block(info.q_path, info, head, batch, info.own_queries() ? info.tokens : n, info.dim, q);
  const std::string problem = magnitude_problem(q, MatrixD(), MatrixD(), info.scale);
  require_input(problem.empty(), "'{}' layer {} head {} batch item {}: {}. Check the dump's values.", path_,
                info.number, head, batch, problem);
  return q;
}

MatrixD Dump::read_keys(int layer_number, int head, int batch, int64_t n) const {
  const LayerInfo& info = checked_slice(layer_number, head, batch, n);
  MatrixD k;
  read_block(info.k_path, info, static_cast<int>(head / (info.heads / info.kv_heads)), batch, n, info.dim, k);
  const std::string problem = magnitude_problem(MatrixD(), k, MatrixD(), info.scale);
  require_input(problem.empty(), "'{}' layer {} head {} batch item {}: {}. Check the dump's values.", path_,
                info.number, head, batch, problem);
  return k;
}

HeadView Dump::read_slice(int layer_number, int head, int batch, int64_t n) const {
  const LayerInfo& info = checked_slice(layer_number, head, batch, n);
  MatrixD q, k, v;
  read_block(info.q_path, info, head, batch, info.own_queries() ? info.tokens : n, info.dim, q);
  // Grouped-query attention: query head h reads kv head h / (H / Hkv) (Llama's repeat_kv).
  const int kv_head = static_cast<int>(head / (info.heads / info.kv_heads));
  read_block(info.k_path, info, kv_head, batch, n, info.dim, k);
  read_block(info.v_path, info, kv_head, batch, n, info.value_dim, v);
  // Finite values that would overflow the float32 estimators turn every metric into NaN with exit 0.
  const std::string problem = magnitude_problem(q, k, v, info.scale);
  require_input(problem.empty(),
                "'{}' layer {} head {} batch item {}: {}. Check the dump's values and its scale attribute.", path_,
                info.number, head, batch, problem);
  HeadView view = make_head_view(SliceId{info.number, head, batch, n, kv_head}, info.scale, std::move(q), std::move(k),
                                 std::move(v));
  if (info.own_queries() && !info.cross) {
    if (info.q_positions.empty())
      view.first_position = n - info.tokens;
    else
      view.positions = info.q_positions[batch];
  }
  view.shaping.softcap = info.softcap;
  view.shaping.bias_before_softcap = info.bias_before_softcap;
  if (!info.alibi_slopes.empty()) view.shaping.alibi_slope = info.alibi_slopes[head];
  if (!info.bias_path.empty()) view.shaping.bias = read_bias(info, head, batch, view.n(), n);
  view.rope_inv_freq = info.rope_inv_freq;
  return view;
}

std::shared_ptr<const MatrixD> Dump::read_bias(const LayerInfo& info, int head, int batch, int64_t rows,
                                               int64_t keys) const {
  // Leading dimensions: [B|1, H|1] of a rank-4 bias, [H|1] of a rank-3 one; a 1 broadcasts.
  const size_t rank = info.bias_shape.size();
  std::vector<int64_t> start(rank, 0), count(rank, 1);
  if (rank == 4 && info.bias_shape[0] != 1) start[0] = batch;
  if (rank >= 3 && info.bias_shape[rank - 3] != 1) start[rank - 3] = head;
  count[rank - 2] = rows;
  count[rank - 1] = keys;
  auto bias = std::make_shared<MatrixD>(rows, keys);
  container_->read(info.bias_path, start, count, bias->data());
  // NaN or ±inf would make rows of NaN; a large finite negative value (a model's "minus infinity", e.g. float32's
  // lowest) masks a key as the model does.
  if (const auto [i, j] = first_non_finite(*bias); i >= 0)
    throw InputError(fmt::format(
        "'{}': {} has a non-finite value ({}) at layer {}, head {}, batch item {}, query row {}, key {}. Masked keys "
        "belong in the causal/window attributes, or as a large finite negative bias (e.g. -1e30).",
        path_, info.bias_path, (*bias)(i, j), info.number, head, batch, i, j));
  return bias;
}

std::optional<MatrixD> Dump::read_upstream(int layer_number, int head, int batch, int64_t n) const {
  const LayerInfo& info = layer(layer_number);
  if (info.dy_path.empty()) return std::nullopt;
  if (head < 0 || head >= info.heads || batch < 0 || batch >= info.batch || n < 1 || n > info.lengths[batch])
    throw InputError(fmt::format("'{}' layer {}: no upstream gradients for head {}, batch item {}, length {}.", path_,
                                 info.number, head, batch, n));
  MatrixD dy;
  read_block(info.dy_path, info, head, batch, n, info.value_dim, dy);
  return dy;
}

}  // namespace attnprobe
