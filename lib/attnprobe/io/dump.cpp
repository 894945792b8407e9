#include "attnprobe/io/dump.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <regex>

#include "attnprobe/common/error.h"

namespace attnprobe {

namespace {

// What the user should read when a dump does not have the expected shape.
constexpr const char* kLayoutHint =
    "attnprobe expects /layer_NN/{q,k,v} of shape [B, H, N, P] (or [H, N, P], [N, P]); other layouts "
    "are read with --layout and --q-path/--k-path/--v-path (see `attnprobe info --help`)";

bool link_exists(hid_t where, const std::string& path) {
  // H5Lexists needs every intermediate group to exist; walk the path one part at a time.
  std::string partial;
  size_t start = path[0] == '/' ? 1 : 0;
  if (start) partial = "/";
  while (start <= path.size()) {
    size_t slash = path.find('/', start);
    std::string part = path.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
    if (part.empty()) break;
    partial += (partial.empty() || partial.back() == '/') ? part : "/" + part;
    if (H5Lexists(where, partial.c_str(), H5P_DEFAULT) <= 0) return false;
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
  return true;
}

H5Handle open_object(hid_t file, const std::string& path) {
  return H5Handle(H5Oopen(file, path.c_str(), H5P_DEFAULT), H5Oclose);
}

std::vector<hsize_t> dataset_shape(hid_t dataset) {
  H5Handle space(H5Dget_space(dataset), H5Sclose);
  int rank = H5Sget_simple_extent_ndims(space.get());
  std::vector<hsize_t> dims(std::max(rank, 0));
  if (rank > 0) H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  return dims;
}

std::string shape_text(const std::vector<hsize_t>& dims) {
  std::vector<std::string> parts;
  for (auto d : dims) parts.push_back(std::to_string(d));
  return "[" + fmt::format("{}", fmt::join(parts, ", ")) + "]";
}

std::optional<double> read_number_attribute(hid_t object, const char* name) {
  if (H5Aexists(object, name) <= 0) return std::nullopt;
  H5Handle attr(H5Aopen(object, name, H5P_DEFAULT), H5Aclose);
  H5Handle space(H5Aget_space(attr.get()), H5Sclose);
  if (H5Sget_simple_extent_npoints(space.get()) != 1) return std::nullopt;
  double value = 0;
  if (H5Aread(attr.get(), H5T_NATIVE_DOUBLE, &value) < 0) return std::nullopt;
  return value;
}

std::string read_string_attribute(hid_t object, const char* name) {
  if (H5Aexists(object, name) <= 0) return "";
  H5Handle attr(H5Aopen(object, name, H5P_DEFAULT), H5Aclose);
  H5Handle type(H5Aget_type(attr.get()), H5Tclose);
  if (H5Tget_class(type.get()) != H5T_STRING) return "";
  if (H5Tis_variable_str(type.get()) > 0) {
    H5Handle mem(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(mem.get(), H5T_VARIABLE);
    H5Tset_cset(mem.get(), H5Tget_cset(type.get()));
    char* text = nullptr;
    if (H5Aread(attr.get(), mem.get(), &text) < 0 || !text) return "";
    std::string out(text);
    H5free_memory(text);
    return out;
  }
  size_t size = H5Tget_size(type.get());
  std::string out(size, '\0');
  H5Handle mem(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(mem.get(), size);
  if (H5Aread(attr.get(), mem.get(), out.data()) < 0) return "";
  out.resize(std::strlen(out.c_str()));
  return out;
}

std::string parent_group(const std::string& path) {
  size_t slash = path.rfind('/');
  if (slash == std::string::npos || slash == 0) return "/";
  return path.substr(0, slash);
}

std::vector<std::pair<int, std::string>> find_layer_groups(hid_t file) {
  std::vector<std::pair<int, std::string>> groups;
  auto visit = [](hid_t group, const char* name, const H5L_info_t*, void* data) -> herr_t {
    static const std::regex kLayerName("layer_([0-9]+)");
    std::cmatch match;
    if (std::regex_match(name, match, kLayerName)) {
      H5O_info_t info;
      if (H5Oget_info_by_name(group, name, &info, H5P_DEFAULT) >= 0 && info.type == H5O_TYPE_GROUP)
        static_cast<std::vector<std::pair<int, std::string>>*>(data)->emplace_back(std::stoi(match[1].str()), name);
    }
    return 0;
  };
  H5Literate(file, H5_INDEX_NAME, H5_ITER_NATIVE, nullptr, visit, &groups);
  std::sort(groups.begin(), groups.end());
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
int64_t dim_of(const std::vector<hsize_t>& dims, const std::string& layout, char letter) {
  size_t pos = layout.find(letter);
  return pos == std::string::npos ? 1 : static_cast<int64_t>(dims[pos]);
}

}  // namespace

Dump Dump::open(const std::string& path, const DumpOptions& options) {
  silence_hdf5_errors();
  if (FILE* f = std::fopen(path.c_str(), "rb")) {
    std::fclose(f);
  } else {
    throw InputError(
        fmt::format("cannot read '{}': {}. Check the path (and permissions).", path, std::strerror(errno)));
  }
  htri_t is_hdf5 = H5Fis_hdf5(path.c_str());
  if (is_hdf5 == 0)
    throw InputError(
        fmt::format("'{}' is not an HDF5 file (no HDF5 signature). attnprobe reads HDF5 dumps; "
                    "tools/dump_qkv.py writes one from a PyTorch model, `attnprobe synth` a synthetic one.",
                    path));
  Dump dump;
  dump.path_ = path;
  dump.num_heads_split_ = options.num_heads;
  hid_t fid = is_hdf5 > 0 ? H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT) : -1;
  if (fid < 0) {
    std::string detail = hdf5_error_detail();
    throw InputError(
        fmt::format("'{}' has an HDF5 signature but cannot be opened{}. The file is probably truncated "
                    "or damaged (an interrupted copy or write?): re-create or re-copy it.",
                    path, detail.empty() ? "" : " (" + detail + ")"));
  }
  dump.file_ = std::make_shared<H5Handle>(fid, H5Fclose);

  const bool explicit_paths = !options.q_path.empty() || !options.k_path.empty() || !options.v_path.empty();
  if (explicit_paths && (options.q_path.empty() || options.k_path.empty() || options.v_path.empty()))
    throw UsageError("--q-path, --k-path and --v-path go together: give all three");
  if (!options.layout.empty() && !valid_layout(options.layout))
    throw UsageError(fmt::format("unknown --layout '{}': use one of bhnp, bnhp, hnp, nhp, bnp, np", options.layout));

  std::vector<LayerInfo> candidates;
  if (explicit_paths) {
    LayerInfo info;
    info.name = parent_group(options.q_path);
    info.q_path = options.q_path;
    info.k_path = options.k_path;
    info.v_path = options.v_path;
    candidates.push_back(info);
  } else {
    for (auto& [number, name] : find_layer_groups(fid)) {
      LayerInfo info;
      info.number = number;
      info.name = name;
      info.q_path = "/" + name + "/q";
      info.k_path = "/" + name + "/k";
      info.v_path = "/" + name + "/v";
      candidates.push_back(info);
    }
    if (candidates.empty()) {
      if (link_exists(fid, "/q")) {
        LayerInfo info;
        info.name = "/";
        info.q_path = "/q";
        info.k_path = "/k";
        info.v_path = "/v";
        candidates.push_back(info);
      } else {
        throw InputError(
            fmt::format("'{}' has no layer_NN groups and no q/k/v datasets at its root. {}.", path, kLayoutHint));
      }
    }
  }

  for (LayerInfo& info : candidates) {
    auto shape_of = [&](const std::string& dataset, const char* role) {
      if (!link_exists(fid, dataset))
        throw InputError(
            fmt::format("'{}' has no dataset {} (the {} of {}). {}.", path, dataset, role, info.name, kLayoutHint));
      H5Handle ds(H5Dopen2(fid, dataset.c_str(), H5P_DEFAULT), H5Dclose);
      if (!ds.valid())
        throw InputError(
            fmt::format("'{}': {} is not a dataset ({}). {}.", path, dataset, hdf5_error_detail(), kLayoutHint));
      H5Handle type(H5Dget_type(ds.get()), H5Tclose);
      if (H5Tget_class(type.get()) != H5T_FLOAT)
        throw InputError(
            fmt::format("'{}': {} is not floating point; attnprobe reads float16/32/64 q, k and v.", path, dataset));
      return dataset_shape(ds.get());
    };
    auto qs = shape_of(info.q_path, "queries");
    auto ks = shape_of(info.k_path, "keys");
    auto vs = shape_of(info.v_path, "values");
    if (qs.size() != ks.size() || qs.size() != vs.size())
      throw InputError(fmt::format("'{}' {}: q, k and v have different ranks ({}, {}, {}). {}.", path, info.name,
                                   shape_text(qs), shape_text(ks), shape_text(vs), kLayoutHint));
    info.layout = options.layout.empty() ? default_layout(qs.size()) : options.layout;
    if (info.layout.size() != qs.size())
      throw InputError(fmt::format("'{}' {}: q has rank {} (shape {}), which the layout '{}' does not fit. {}.", path,
                                   info.q_path, qs.size(), shape_text(qs),
                                   info.layout.empty() ? "(none for this rank)" : info.layout, kLayoutHint));
    for (auto* dims : {&qs, &ks, &vs})
      for (hsize_t d : *dims)
        if (d == 0)
          throw InputError(
              fmt::format("'{}' {}: a dataset has an empty dimension ({}).", path, info.name, shape_text(*dims)));
    info.batch = dim_of(qs, info.layout, 'b');
    info.heads = dim_of(qs, info.layout, 'h');
    info.tokens = dim_of(qs, info.layout, 'n');
    info.dim = dim_of(qs, info.layout, 'p');
    info.value_dim = dim_of(vs, info.layout, 'p');
    if (options.num_heads > 0) {
      if (info.layout.find('h') != std::string::npos)
        throw UsageError(
            fmt::format("--num-heads splits the last dimension into heads, but layout '{}' already has "
                        "a head dimension; use --layout bnp or np",
                        info.layout));
      if (info.dim % options.num_heads || info.value_dim % options.num_heads)
        throw InputError(fmt::format("'{}' {}: the last dimensions ({} for q/k, {} for v) do not split into {} heads.",
                                     path, info.name, info.dim, info.value_dim, options.num_heads));
      info.heads = options.num_heads;
      info.dim /= options.num_heads;
      info.value_dim /= options.num_heads;
    }
    auto mismatch = [&](const char* what) {
      return InputError(
          fmt::format("'{}' {}: q {}, k {} and v {} do not match in {} (layout {}). q/k/v must share "
                      "batch, heads and tokens, and q/k the head dim.",
                      path, info.name, shape_text(qs), shape_text(ks), shape_text(vs), what, info.layout));
    };
    for (char c : std::string("bh"))
      if (dim_of(ks, info.layout, c) != dim_of(qs, info.layout, c) ||
          dim_of(vs, info.layout, c) != dim_of(qs, info.layout, c))
        throw mismatch(c == 'b' ? "batch" : "heads");
    if (dim_of(ks, info.layout, 'p') != dim_of(qs, info.layout, 'p')) throw mismatch("head dim");
    if (dim_of(ks, info.layout, 'n') != info.tokens || dim_of(vs, info.layout, 'n') != info.tokens)
      throw mismatch("tokens (attnprobe measures self-attention, so keys and values need as many tokens as queries)");

    H5Handle q_ds(H5Dopen2(fid, info.q_path.c_str(), H5P_DEFAULT), H5Dclose);
    H5Handle q_type(H5Dget_type(q_ds.get()), H5Tclose);
    size_t bytes = H5Tget_size(q_type.get());
    info.dtype = bytes == 2   ? "float16"
                 : bytes == 4 ? "float32"
                 : bytes == 8 ? "float64"
                              : fmt::format("float{}", bytes * 8);
    H5Handle dcpl(H5Dget_create_plist(q_ds.get()), H5Pclose);
    info.compressed = H5Pget_nfilters(dcpl.get()) > 0;

    const std::string group_path = info.name == "/" ? "/" : (info.name[0] == '/' ? info.name : "/" + info.name);
    H5Handle group = open_object(fid, group_path);
    if (!group.valid()) throw InputError(fmt::format("'{}': cannot open group {}", path, group_path));
    if (auto scale = read_number_attribute(group.get(), "scale")) {
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
    if (auto causal = read_number_attribute(group.get(), "causal")) info.causal = static_cast<int>(*causal);

    // Optional real upstream gradients of the attention output: the shape of v (docs/dumps.md).
    const std::string dy_path = (group_path == "/" ? "" : group_path) + "/dy";
    if (!explicit_paths && link_exists(fid, dy_path)) {
      const auto dys = shape_of(dy_path, "upstream gradients");
      if (dys != vs)
        throw InputError(
            fmt::format("'{}': {} has shape {}, but it must have the shape of v, {} (upstream gradients "
                        "of the attention output). Fix or remove it.",
                        path, dy_path, shape_text(dys), shape_text(vs)));
      info.dy_path = dy_path;
    }

    info.lengths.assign(info.batch, info.tokens);
    const std::string lengths_path = (group_path == "/" ? "" : group_path) + "/lengths";
    if (link_exists(fid, lengths_path)) {
      H5Handle ds(H5Dopen2(fid, lengths_path.c_str(), H5P_DEFAULT), H5Dclose);
      auto shape = dataset_shape(ds.get());
      H5Handle type(H5Dget_type(ds.get()), H5Tclose);
      if (shape.size() != 1 || static_cast<int64_t>(shape[0]) != info.batch || H5Tget_class(type.get()) != H5T_INTEGER)
        throw InputError(fmt::format("'{}': {} must be an integer vector of the batch size {} (it is {}).", path,
                                     lengths_path, info.batch, shape_text(shape)));
      std::vector<long long> values(info.batch);
      if (H5Dread(ds.get(), H5T_NATIVE_LLONG, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) < 0)
        throw InputError(fmt::format("'{}': cannot read {} ({}).", path, lengths_path, hdf5_error_detail()));
      for (int64_t b = 0; b < info.batch; ++b) {
        if (values[b] < 1 || values[b] > info.tokens)
          throw InputError(fmt::format("'{}': {}[{}] = {} is outside 1..{} (the token count).", path, lengths_path, b,
                                       values[b], info.tokens));
        info.lengths[b] = values[b];
      }
      info.has_lengths = true;
    }
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

std::string Dump::root_attribute(const std::string& name) const {
  return read_string_attribute(file_->get(), name.c_str());
}

void Dump::read_block(const std::string& dataset, const LayerInfo& info, int head, int batch, int64_t n, int64_t width,
                      MatrixD& out) const {
  H5Handle ds(H5Dopen2(file_->get(), dataset.c_str(), H5P_DEFAULT), H5Dclose);
  H5Handle space(H5Dget_space(ds.get()), H5Sclose);
  const size_t rank = info.layout.size();
  std::vector<hsize_t> start(rank), count(rank);
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
  out.resize(n, width);
  hsize_t mem_dims[2] = {static_cast<hsize_t>(n), static_cast<hsize_t>(width)};
  H5Handle mem(H5Screate_simple(2, mem_dims, nullptr), H5Sclose);
  if (H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr) < 0 ||
      H5Dread(ds.get(), H5T_NATIVE_DOUBLE, mem.get(), space.get(), H5P_DEFAULT, out.data()) < 0) {
    throw InputError(
        fmt::format("'{}': reading {} (head {}, batch item {}) failed ({}). The file is probably "
                    "truncated or damaged: re-create or re-copy it.",
                    path_, dataset, head, batch, hdf5_error_detail()));
  }
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = 0; c < width; ++c)
      if (!std::isfinite(out(i, c)))
        throw InputError(
            fmt::format("'{}': {} has a non-finite value ({}) at layer {}, head {}, batch item {}, token "
                        "{}, column {}. Fix the dump (e.g. an overflow in float16?) or leave this slice "
                        "out with --layers/--heads/--batch.",
                        path_, dataset, out(i, c), info.number, head, batch, i, c));
}

HeadView Dump::read_slice(int layer_number, int head, int batch, int64_t n) const {
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
  MatrixD q, k, v;
  read_block(info.q_path, info, head, batch, n, info.dim, q);
  read_block(info.k_path, info, head, batch, n, info.dim, k);
  read_block(info.v_path, info, head, batch, n, info.value_dim, v);
  return make_head_view(SliceId{info.number, head, batch, n}, info.scale, std::move(q), std::move(k), std::move(v));
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
