#include "attnprobe/io/dump_writer.h"

#include <fmt/format.h>

#include <algorithm>

#include "attnprobe/common/atomic_file.h"
#include "attnprobe/common/error.h"
#include "attnprobe/io/h5_handle.h"

namespace attnprobe {

namespace {

// IEEE 754 binary16 as an HDF5 type: HDF5 1.10 has no predefined half type, but converts any
// described float format, and readers such as h5py/numpy recognise this description as float16.
H5Handle make_float16_type() {
  H5Handle type(H5Tcopy(H5T_IEEE_F32LE), H5Tclose);
  H5Tset_fields(type.get(), 15, 10, 5, 0, 10);  // sign bit, exponent at 10 (5 bits), mantissa 10 bits
  H5Tset_precision(type.get(), 16);
  H5Tset_size(type.get(), 2);
  H5Tset_ebias(type.get(), 15);
  return type;
}

H5Handle stored_type(StoredType type) {
  switch (type) {
    case StoredType::kFloat16:
      return make_float16_type();
    case StoredType::kFloat32:
      return H5Handle(H5Tcopy(H5T_IEEE_F32LE), H5Tclose);
    case StoredType::kFloat64:
      return H5Handle(H5Tcopy(H5T_IEEE_F64LE), H5Tclose);
  }
  return {};
}

void check(herr_t status, const std::string& path, const std::string& what) {
  if (status < 0) throw InputError(fmt::format("cannot write '{}': {} failed ({})", path, what, hdf5_error_detail()));
}

void write_string_attribute(hid_t object, const std::string& name, const std::string& value, const std::string& path) {
  H5Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.get(), std::max<size_t>(value.size(), 1));
  H5Tset_strpad(type.get(), H5T_STR_NULLPAD);
  H5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Handle attr(H5Acreate2(object, name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  check(H5Awrite(attr.get(), type.get(), value.c_str()), path, "attribute " + name);
}

void write_number_attribute(hid_t object, const std::string& name, hid_t file_type, hid_t mem_type, const void* value,
                            const std::string& path) {
  H5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  H5Handle attr(H5Acreate2(object, name.c_str(), file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  check(H5Awrite(attr.get(), mem_type, value), path, "attribute " + name);
}

}  // namespace

StoredType parse_stored_type(const std::string& name) {
  if (name == "f16" || name == "float16") return StoredType::kFloat16;
  if (name == "f32" || name == "float32") return StoredType::kFloat32;
  if (name == "f64" || name == "float64") return StoredType::kFloat64;
  throw UsageError(fmt::format("unknown dtype '{}': use float16, float32 or float64", name));
}

void write_dump(const std::string& path, const DumpContents& contents, const DumpWriteOptions& options) {
  silence_hdf5_errors();
  H5Handle fcpl(H5Pcreate(H5P_FILE_CREATE), H5Pclose);
  // HDF5 builds the file in memory (the core driver, no backing store) and write_file_atomically
  // writes its image: a full disk fails a write we check, and no half-written file is left. Writing
  // through HDF5 itself, a failed flush left the file open in the library, which crashed at exit.
  H5Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  check(H5Pset_fapl_core(fapl.get(), size_t{1} << 20, false), path, "the in-memory driver");
  H5Handle file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, fcpl.get(), fapl.get()), H5Fclose);
  if (!file.valid()) throw InputError(fmt::format("cannot create '{}' ({})", path, hdf5_error_detail()));
  for (const auto& [name, value] : contents.attributes) write_string_attribute(file.get(), name, value, path);

  H5Handle gcpl(H5Pcreate(H5P_GROUP_CREATE), H5Pclose);
  H5Pset_obj_track_times(gcpl.get(), false);
  for (const DumpLayer& layer : contents.layers) {
    H5Handle group(H5Gcreate2(file.get(), layer.name.c_str(), H5P_DEFAULT, gcpl.get(), H5P_DEFAULT), H5Gclose);
    if (!group.valid()) throw InputError(fmt::format("cannot create group {} in '{}'", layer.name, path));
    if (layer.scale)
      write_number_attribute(group.get(), "scale", H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &*layer.scale, path);
    if (layer.causal)
      write_number_attribute(group.get(), "causal", H5T_STD_I32LE, H5T_NATIVE_INT, &*layer.causal, path);
    for (const auto& [name, value] : layer.integer_attributes)
      write_number_attribute(group.get(), name.c_str(), H5T_STD_I64LE, H5T_NATIVE_INT64, &value, path);
    for (const auto& [name, value] : layer.real_attributes)
      write_number_attribute(group.get(), name.c_str(), H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &value, path);
    for (const auto& [name, array] : layer.integer_datasets) {
      H5Handle space(H5Screate_simple(static_cast<int>(array.shape.size()), array.shape.data(), nullptr), H5Sclose);
      const std::vector<int64_t> values(array.values.begin(), array.values.end());
      H5Handle ds(
          H5Dcreate2(group.get(), name.c_str(), H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
          H5Dclose);
      check(H5Dwrite(ds.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), path,
            layer.name + "/" + name);
    }
    for (const auto& [name, array] : layer.datasets) {
      H5Handle space(H5Screate_simple(static_cast<int>(array.shape.size()), array.shape.data(), nullptr), H5Sclose);
      H5Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
      H5Pset_obj_track_times(dcpl.get(), false);
      if (options.gzip_level > 0) {
        // Chunk = one token row block of one head: a slice read touches only its own chunks.
        std::vector<hsize_t> chunk(array.shape.size(), 1);
        if (!chunk.empty()) chunk.back() = array.shape.back();
        if (chunk.size() >= 2) chunk[chunk.size() - 2] = std::min<hsize_t>(array.shape[chunk.size() - 2], 256);
        check(H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()), path, "chunking");
        check(H5Pset_deflate(dcpl.get(), options.gzip_level), path, "gzip");
      }
      H5Handle type = stored_type(options.type);
      H5Handle ds(H5Dcreate2(group.get(), name.c_str(), type.get(), space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
                  H5Dclose);
      if (!ds.valid())
        throw InputError(fmt::format("cannot create {}/{} in '{}' ({})", layer.name, name, path, hdf5_error_detail()));
      check(H5Dwrite(ds.get(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, array.values.data()), path,
            layer.name + "/" + name);
    }
    if (layer.lengths) {
      hsize_t dims[1] = {layer.lengths->size()};
      H5Handle space(H5Screate_simple(1, dims, nullptr), H5Sclose);
      H5Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
      H5Pset_obj_track_times(dcpl.get(), false);
      H5Handle ds(H5Dcreate2(group.get(), "lengths", H5T_STD_I64LE, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
                  H5Dclose);
      check(H5Dwrite(ds.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, layer.lengths->data()), path,
            layer.name + "/lengths");
    }
  }
  check(H5Fflush(file.get(), H5F_SCOPE_GLOBAL), path, "flush");
  const ssize_t size = H5Fget_file_image(file.get(), nullptr, 0);
  check(size < 0 ? -1 : 0, path, "the file image");
  std::string image(static_cast<size_t>(size), '\0');
  check(H5Fget_file_image(file.get(), image.data(), image.size()) == size ? 0 : -1, path, "the file image");
  file.reset();
  write_file_atomically(path, image);
}

}  // namespace attnprobe
