// The HDF5 container (docs/dumps.md): groups /layer_NN holding the datasets q, k, v (and lengths,
// dy), attributes scale/causal on the groups and model/source/created_by on the root. Opening reads
// the file's metadata and refuses storage HDF5 would read as fill values (unwritten, truncated,
// missing external or virtual sources, unavailable filters); a block read is one hyperslab read that
// HDF5 converts to float64 (decompressing only the chunks it touches).
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <exception>
#include <filesystem>
#include <string_view>

#include "attnprobe/common/error.h"
#include "attnprobe/io/container.h"
#include "attnprobe/io/h5_handle.h"

namespace attnprobe {

namespace {

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
  // Read in the file's own string type (size, padding): a NULLTERM memory type of the same size, as
  // before, dropped the last character of a NULLPAD string (ours among them) to fit a terminator.
  const size_t size = H5Tget_size(type.get());
  std::string out(size, '\0');
  H5Handle mem(H5Tcopy(type.get()), H5Tclose);
  if (H5Aread(attr.get(), mem.get(), out.data()) < 0) return "";
  if (H5Tget_strpad(type.get()) == H5T_STR_SPACEPAD) {
    const size_t last = out.find_last_not_of(' ');
    out.resize(last == std::string::npos ? 0 : last + 1);
  } else {
    out.resize(strnlen(out.data(), size));
  }
  return out;
}

// The root groups named layer_<digits>. Nothing may throw through libhdf5's iteration (a C frame):
// the callback only collects names, catching everything.
std::vector<std::string> find_layer_groups(hid_t file) {
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
  return visit.names;
}

// "/layer_00", "layer_00", "" and "/" → the absolute group path.
std::string absolute_group(const std::string& group) {
  if (group.empty() || group == "/") return "/";
  return group[0] == '/' ? group : "/" + group;
}

class Hdf5Container final : public Container {
 public:
  Hdf5Container(const std::string& path, hid_t file) : path_(path), file_(file, H5Fclose) {}

  std::string format() const override { return "HDF5"; }
  std::string noun() const override { return "dataset"; }
  std::vector<std::string> layer_groups() const override { return find_layer_groups(file_.get()); }
  std::string member_name(const std::string& group, const std::string& member) const override {
    const std::string g = absolute_group(group);
    return (g == "/" ? "" : g) + "/" + member;
  }
  std::string group_of(const std::string& name) const override {
    const size_t slash = name.rfind('/');
    if (slash == std::string::npos || slash == 0) return "";
    return name.substr(0, slash);
  }
  bool has_tensor(const std::string& name) const override { return !name.empty() && link_exists(file_.get(), name); }

  TensorInfo tensor(const std::string& name) const override {
    H5Handle ds(H5Dopen2(file_.get(), name.c_str(), H5P_DEFAULT), H5Dclose);
    require_input(ds.valid(),
                  "'{}': {} is not a dataset ({}). attnprobe expects /layer_NN/{{q,k,v}} datasets (see `attnprobe "
                  "info --help`).",
                  path_, name, hdf5_error_detail());
    H5Handle type(H5Dget_type(ds.get()), H5Tclose);
    const H5T_class_t type_class = H5Tget_class(type.get());
    TensorInfo info;
    info.floating = type_class == H5T_FLOAT;
    info.integer = type_class == H5T_INTEGER;
    const size_t bytes = H5Tget_size(type.get());
    info.dtype = info.floating  ? fmt::format("float{}", bytes * 8)
                 : info.integer ? fmt::format("int{}", bytes * 8)
                                : "not a number";
    if (info.floating) check_storage(ds.get(), path_, name);
    for (hsize_t d : dataset_shape(ds.get())) info.shape.push_back(static_cast<int64_t>(d));
    H5Handle dcpl(H5Dget_create_plist(ds.get()), H5Pclose);
    info.compressed = H5Pget_nfilters(dcpl.get()) > 0;
    return info;
  }

  std::optional<double> number_attribute(const std::string& group, const std::string& name) const override {
    const std::string g = absolute_group(group);
    H5Handle object = open_object(file_.get(), g);
    require_input(object.valid(), "'{}': cannot open group {} ({}).", path_, g, hdf5_error_detail());
    return read_number_attribute(object.get(), name.c_str(), path_, group.empty() ? "/" : group);
  }
  std::string string_attribute(const std::string& name) const override {
    return read_string_attribute(file_.get(), name.c_str());
  }

  void read(const std::string& name, const std::vector<int64_t>& start, const std::vector<int64_t>& count,
            double* out) const override {
    H5Handle ds(H5Dopen2(file_.get(), name.c_str(), H5P_DEFAULT), H5Dclose);
    H5Handle space(ds.valid() ? H5Dget_space(ds.get()) : H5I_INVALID_HID, H5Sclose);
    std::vector<hsize_t> first(start.begin(), start.end()), size(count.begin(), count.end());
    hsize_t points = 1;
    for (hsize_t c : size) points *= c;
    H5Handle mem(H5Screate_simple(1, &points, nullptr), H5Sclose);
    const bool ok = space.valid() &&
                    (size.empty() || H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, first.data(), nullptr,
                                                         size.data(), nullptr) >= 0) &&
                    H5Dread(ds.get(), H5T_NATIVE_DOUBLE, mem.get(), space.get(), H5P_DEFAULT, out) >= 0;
    require_input(ok,
                  "'{}': reading {} failed ({}). The file is probably truncated or damaged: re-create or re-copy it.",
                  path_, name, hdf5_error_detail());
  }

 private:
  std::string path_;
  H5Handle file_;
};

}  // namespace

std::unique_ptr<Container> open_hdf5_container(const std::string& path) {
  silence_hdf5_errors();
  const hid_t fid = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (fid < 0) {
    const std::string detail = hdf5_error_detail();
    throw InputError(
        fmt::format("'{}' has an HDF5 signature but cannot be opened{}. The file is probably truncated "
                    "or damaged (an interrupted copy or write?): re-create or re-copy it.",
                    path, detail.empty() ? "" : " (" + detail + ")"));
  }
  return std::make_unique<Hdf5Container>(path, fid);
}

}  // namespace attnprobe
