#include "attnprobe/io/dump.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <limits>
#include <string_view>

#include "attnprobe/common/error.h"

namespace attnprobe {

namespace {

// What the user should read when a dump does not have the expected shape.
constexpr const char* kLayoutHint =
    "attnprobe expects /layer_NN/{q,k,v} of shape [B, H, N, P] (or [H, N, P], [N, P]); other layouts "
    "are read with --layout and --q-path/--k-path/--v-path (see `attnprobe info --help`)";

// The largest row norm and score |s·q·k| accepted: float32 holds 3.4e38, and squared norms, sums
// over p and n, and exp(score − max) must all stay finite in it.
constexpr double kMaxRowNorm = 1e18;
constexpr double kMaxScore = 1e30;

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

// A one-element numeric attribute (integer or float, any width) as a double; nullopt when absent.
// Present but of another type (a string, an array, a compound) is an input error: reading it as
// "absent" would silently use the default instead of what the writer meant.
std::optional<double> read_number_attribute(hid_t object, const char* name, const std::string& path,
                                            const std::string& group) {
  if (H5Aexists(object, name) <= 0) return std::nullopt;
  H5Handle attr(H5Aopen(object, name, H5P_DEFAULT), H5Aclose);
  H5Handle space(H5Aget_space(attr.get()), H5Sclose);
  H5Handle type(H5Aget_type(attr.get()), H5Tclose);
  const H5T_class_t type_class = H5Tget_class(type.get());
  const hssize_t points = H5Sget_simple_extent_npoints(space.get());
  require_input((type_class == H5T_FLOAT || type_class == H5T_INTEGER) && points == 1,
                "'{}' {}: the {} attribute must be one number (an integer or float scalar), but it is {} with {} "
                "element{}. Rewrite it as a number.",
                path, group, name,
                type_class == H5T_STRING    ? "a string"
                : type_class == H5T_FLOAT   ? "a float array"
                : type_class == H5T_INTEGER ? "an integer array"
                                            : "not a number",
                points, points == 1 ? "" : "s");
  double value = 0;
  require_input(H5Aread(attr.get(), H5T_NATIVE_DOUBLE, &value) >= 0, "'{}' {}: cannot read the {} attribute ({}).",
                path, group, name, hdf5_error_detail());
  return value;
}

// A relative file name of an HDF5 link to other files (external storage, virtual sources) as HDF5
// resolves it: the current folder, then the dump's own folder.
std::filesystem::path resolve_beside(const std::string& name, const std::string& dump_path) {
  const std::filesystem::path file(name);
  if (file.is_absolute() || std::filesystem::exists(file)) return file;
  return std::filesystem::path(dump_path).parent_path() / file;
}

// Storage that HDF5 would read as zeros or fill values, or cannot decode, is refused at open time:
// a dataset declared but never (fully) written, a contiguous dataset that runs past the end of the
// file, external files that are missing or too short, virtual datasets whose sources are missing or
// smaller than their mapping, and filters (compression plugins) this HDF5 library does not have.
void check_storage(hid_t ds, const std::string& path, const std::string& dataset) {
  H5Handle dcpl(H5Dget_create_plist(ds), H5Pclose);
  H5Handle type(H5Dget_type(ds), H5Tclose);
  H5Handle space(H5Dget_space(ds), H5Sclose);
  const double points = static_cast<double>(H5Sget_simple_extent_npoints(space.get()));
  const double bytes = points * static_cast<double>(H5Tget_size(type.get()));
  const H5D_layout_t layout = H5Pget_layout(dcpl.get());

  const int filters = H5Pget_nfilters(dcpl.get());
  for (int i = 0; i < filters; ++i) {
    unsigned flags = 0, config = 0;
    size_t values = 0;
    char name[256] = "";
    const H5Z_filter_t id = H5Pget_filter2(dcpl.get(), i, &flags, &values, nullptr, sizeof name, name, &config);
    require_input(id < 0 || H5Zfilter_avail(id) > 0,
                  "'{}': {} is stored through the HDF5 filter {} ('{}'), which this HDF5 library does not have. "
                  "Install the filter's plugin and point HDF5_PLUGIN_PATH at its folder, or rewrite the file without "
                  "it (e.g. h5repack -f NONE).",
                  path, dataset, id, name);
  }

  if (layout == H5D_VIRTUAL) {
    const std::string dump_dir = std::filesystem::path(path).parent_path().string();
    size_t count = 0;
    H5Pget_virtual_count(dcpl.get(), &count);
    for (size_t i = 0; i < count; ++i) {
      std::string file(static_cast<size_t>(std::max<ssize_t>(H5Pget_virtual_filename(dcpl.get(), i, nullptr, 0), 0)),
                       '\0');
      H5Pget_virtual_filename(dcpl.get(), i, file.data(), file.size() + 1);
      std::string source(static_cast<size_t>(std::max<ssize_t>(H5Pget_virtual_dsetname(dcpl.get(), i, nullptr, 0), 0)),
                         '\0');
      H5Pget_virtual_dsetname(dcpl.get(), i, source.data(), source.size() + 1);
      const std::filesystem::path resolved = file == "." ? std::filesystem::path(path) : resolve_beside(file, path);
      H5Handle source_file(
          std::filesystem::exists(resolved) ? H5Fopen(resolved.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT) : H5I_INVALID_HID,
          H5Fclose);
      H5Handle source_ds(source_file.valid() && !source.empty() && link_exists(source_file.get(), source)
                             ? H5Dopen2(source_file.get(), source.c_str(), H5P_DEFAULT)
                             : H5I_INVALID_HID,
                         H5Dclose);
      require_input(source_ds.valid(),
                    "'{}': {} is a virtual dataset whose source {} in '{}' cannot be opened (HDF5 would read fill "
                    "values for it). Put the source file beside the dump, or write the data into the dump itself.",
                    path, dataset, source, file);
      // The mapping's source selection must lie inside the source dataset's actual shape.
      H5Handle mapped(H5Pget_virtual_srcspace(dcpl.get(), i), H5Sclose);
      const std::vector<hsize_t> actual = dataset_shape(source_ds.get());
      const int rank = H5Sget_simple_extent_ndims(mapped.get());
      std::vector<hsize_t> start(std::max(rank, 0)), end(std::max(rank, 0));
      bool inside =
          rank == static_cast<int>(actual.size()) && H5Sget_select_bounds(mapped.get(), start.data(), end.data()) >= 0;
      for (int d = 0; inside && d < rank; ++d) inside = end[d] < actual[d];
      require_input(inside,
                    "'{}': {} is a virtual dataset mapping more of {} in '{}' than it holds ({}): the rest would "
                    "read as fill values.",
                    path, dataset, source, file, shape_text(actual));
    }
    return;
  }

  const int externals = H5Pget_external_count(dcpl.get());
  if (externals > 0) {
    double remaining = bytes;
    for (int i = 0; i < externals && remaining > 0; ++i) {
      char name[4096] = "";
      off_t offset = 0;
      hsize_t size = 0;
      H5Pget_external(dcpl.get(), static_cast<unsigned>(i), sizeof name, name, &offset, &size);
      const double take = size == H5F_UNLIMITED ? remaining : std::min(remaining, static_cast<double>(size));
      const std::filesystem::path file = resolve_beside(name, path);
      std::error_code ec;
      const double have = static_cast<double>(std::filesystem::file_size(file, ec));
      require_input(!ec && have >= static_cast<double>(offset) + take,
                    "'{}': {} is stored in the external file '{}', which {} ({} bytes needed from offset {}). "
                    "Restore the file beside the dump.",
                    path, dataset, name, ec ? "cannot be read: " + ec.message() : fmt::format("has {} bytes", have),
                    take, offset);
      remaining -= take;
    }
    return;
  }

  if (points == 0 || layout == H5D_COMPACT) return;
  // Written or not: a contiguous dataset has its space allocated; a chunked one has every chunk.
  // (H5Dget_space_status reports "partly" for complete chunked datasets with edge chunks in HDF5
  // 1.10, so chunks are counted instead.)
  bool written = true;
  if (layout == H5D_CHUNKED) {
    const int rank = H5Sget_simple_extent_ndims(space.get());
    std::vector<hsize_t> chunk(std::max(rank, 0));
    H5Pget_chunk(dcpl.get(), rank, chunk.data());
    const std::vector<hsize_t> dims = dataset_shape(ds);
    double expected = 1;
    for (int d = 0; d < rank; ++d) expected *= std::ceil(static_cast<double>(dims[d]) / static_cast<double>(chunk[d]));
    hsize_t have = 0;
    written = H5Dget_num_chunks(ds, space.get(), &have) >= 0 && static_cast<double>(have) >= expected;
  } else {
    H5D_space_status_t status = H5D_SPACE_STATUS_ERROR;
    written = H5Dget_space_status(ds, &status) >= 0 && status == H5D_SPACE_STATUS_ALLOCATED;
  }
  require_input(written,
                "'{}': {} is declared {} but not (fully) written (HDF5 would read its fill value, zeros, for the "
                "rest): the writer was interrupted, or the file was made without data. Re-create the dump.",
                path, dataset, shape_text(dataset_shape(ds)));
  if (layout == H5D_CONTIGUOUS) {
    const haddr_t offset = H5Dget_offset(ds);
    std::error_code ec;
    const double file_bytes = static_cast<double>(std::filesystem::file_size(path, ec));
    require_input(ec || offset == HADDR_UNDEF || static_cast<double>(offset) + bytes <= file_bytes,
                  "'{}': {} runs to byte {} but the file has {} bytes. The file is truncated (an interrupted copy or "
                  "write?): re-create or re-copy it.",
                  path, dataset, static_cast<double>(offset) + bytes, file_bytes);
  }
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

// The root groups named layer_<digits>, sorted by number. Nothing may throw through libhdf5's
// iteration (a C frame): the callback only collects names, catching everything; the numbers are
// checked afterwards, where an out-of-range number or two names for one layer are input errors.
std::vector<std::pair<int, std::string>> find_layer_groups(hid_t file, const std::string& path) {
  struct Visit {
    std::vector<std::string> names;
    std::exception_ptr error;
  } visit;
  auto callback = [](hid_t group, const char* name, const H5L_info_t*, void* data) -> herr_t {
    auto* v = static_cast<Visit*>(data);
    try {
      const std::string_view text(name);
      if (text.size() <= 6 || text.substr(0, 6) != "layer_") return 0;
      if (!std::all_of(text.begin() + 6, text.end(), [](char c) { return c >= '0' && c <= '9'; })) return 0;
      H5O_info_t info;
      if (H5Oget_info_by_name(group, name, &info, H5P_DEFAULT) >= 0 && info.type == H5O_TYPE_GROUP)
        v->names.emplace_back(text);
      return 0;
    } catch (...) {
      v->error = std::current_exception();
      return -1;  // stops the iteration; rethrown below
    }
  };
  H5Literate(file, H5_INDEX_NAME, H5_ITER_NATIVE, nullptr, callback, &visit);
  if (visit.error) std::rethrow_exception(visit.error);

  std::vector<std::pair<int, std::string>> groups;
  for (const std::string& name : visit.names) {
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
int64_t dim_of(const std::vector<hsize_t>& dims, const std::string& layout, char letter) {
  size_t pos = layout.find(letter);
  return pos == std::string::npos ? 1 : static_cast<int64_t>(dims[pos]);
}

}  // namespace

Dump Dump::open(const std::string& path, const DumpOptions& options) {
  silence_hdf5_errors();
  if (std::error_code ec; std::filesystem::is_directory(path, ec))
    throw InputError(fmt::format("'{}' is a directory, not a dump: give the path of the HDF5 file.", path));
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
    for (auto& [number, name] : find_layer_groups(fid, path)) {
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
      check_storage(ds.get(), path, dataset);
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
    for (auto* dims : {&qs, &ks, &vs})
      for (hsize_t d : *dims)
        require_input(d <= static_cast<hsize_t>(std::numeric_limits<int>::max()),
                      "'{}' {}: a dimension of {} is beyond {} (the largest batch, head or token count attnprobe "
                      "reads).",
                      path, info.name, shape_text(*dims), std::numeric_limits<int>::max());
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
    if (auto scale = read_number_attribute(group.get(), "scale", path, info.name)) {
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
    if (auto causal = read_number_attribute(group.get(), "causal", path, info.name)) {
      require_input(*causal == 0 || *causal == 1, "'{}' {}: the causal attribute is {}; it must be 0 or 1.", path,
                    info.name, *causal);
      info.causal = static_cast<int>(*causal);
    }

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
  // Finite float64 values can still overflow what the estimators compute in float32 (squared norms,
  // scores s·q·k and their exponentials), which would turn every metric into NaN with exit 0. Bound
  // each row norm by max|x|·sqrt(width), which cannot itself overflow.
  auto norm_bound = [](const MatrixD& m) { return m.cwiseAbs().maxCoeff() * std::sqrt(static_cast<double>(m.cols())); };
  const double bq = norm_bound(q), bk = norm_bound(k), bv = norm_bound(v);
  require_input(
      bq <= kMaxRowNorm && bk <= kMaxRowNorm && bv <= kMaxRowNorm && info.scale * bq * bk <= kMaxScore,
      "'{}' layer {} head {} batch item {}: values this large overflow (largest row norms: q {:.3g}, k {:.3g}, "
      "v {:.3g}; scale {:.3g}; scale·|q|·|k| {:.3g}, limits {:.0e} per row and {:.0e} per score). Check the "
      "dump's values and its scale attribute.",
      path_, info.number, head, batch, bq, bk, bv, info.scale, info.scale * bq * bk, kMaxRowNorm, kMaxScore);
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
