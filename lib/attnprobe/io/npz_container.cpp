// The .npz container (docs/dumps.md): numpy's zip of .npy arrays, entries stored or deflated.
// Opening reads the zip's central directory and each entry's .npy header (for a deflated entry,
// only as much of the stream as the header needs); an entry's data is checked against its CRC-32
// and, if deflated, inflated once, on its first read (then kept in memory). Every size and offset
// is checked against the mapped file before it is touched. Zip64 sizes (numpy writes them) are read.
#include <fmt/format.h>
#include <zlib.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <map>
#include <mutex>

#include "attnprobe/common/error.h"
#include "attnprobe/io/container.h"
#include "attnprobe/io/raw_array.h"

namespace attnprobe {

namespace {

uint64_t le(const unsigned char* p, int bytes) {
  uint64_t value = 0;
  for (int i = bytes - 1; i >= 0; --i) value = (value << 8) | p[i];
  return value;
}

struct Entry {
  std::string array;  // entry name without ".npy"
  int method = 0;     // 0 stored, 8 deflated
  uint32_t crc = 0;
  uint64_t compressed = 0, size = 0;  // bytes in the file, bytes of the .npy
  uint64_t data = 0;                  // absolute offset of the entry's (compressed) bytes
  // From the .npy header:
  std::optional<RawType> type;
  std::string descr;
  std::vector<int64_t> shape;
  uint64_t header_bytes = 0;  // the .npy preamble + header; the array's bytes follow
  // Filled on first read (guarded by the container's mutex): the .npy bytes, checked.
  mutable bool checked = false;
  mutable std::vector<unsigned char> inflated;
};

class NpzContainer final : public DottedContainer {
 public:
  explicit NpzContainer(const std::string& path) : path_(path), file_(path) {
    const unsigned char* base = file_.data();
    const uint64_t size = file_.size();
    // The end-of-central-directory record: 22 bytes plus a comment of up to 65535, at the end.
    int64_t eocd = -1;
    for (int64_t at = static_cast<int64_t>(size) - 22; at >= 0 && at >= static_cast<int64_t>(size) - 22 - 65535; --at)
      if (le(base + at, 4) == 0x06054b50) {
        eocd = at;
        break;
      }
    require_input(eocd >= 0,
                  "'{}' starts as a zip (.npz) but has no end-of-central-directory record: the file is truncated (an "
                  "interrupted copy or write?). Re-create or re-copy it.",
                  path);
    uint64_t entries = le(base + eocd + 10, 2), directory_bytes = le(base + eocd + 12, 4),
             directory = le(base + eocd + 16, 4);
    if (entries == 0xFFFF || directory == 0xFFFFFFFF || directory_bytes == 0xFFFFFFFF) {
      // Zip64: the locator (20 bytes before) points at the zip64 end-of-central-directory record.
      require_input(eocd >= 20 && le(base + eocd - 20, 4) == 0x07064b50,
                    "'{}': the zip's zip64 locator is missing: the file is damaged. Re-create it.", path);
      const uint64_t record = le(base + eocd - 20 + 8, 8);
      require_input(record <= size && size - record >= 56 && le(base + record, 4) == 0x06064b50,
                    "'{}': the zip64 end-of-central-directory record is past the end or damaged. Re-create the file.",
                    path);
      entries = le(base + record + 32, 8);
      directory_bytes = le(base + record + 40, 8);
      directory = le(base + record + 48, 8);
    }
    require_input(directory <= size && directory_bytes <= size - directory,
                  "'{}': the zip's central directory (offset {}, {} bytes) runs past the end of the file ({} bytes): "
                  "the file is truncated. Re-create or re-copy it.",
                  path, directory, directory_bytes, size);
    uint64_t at = directory;
    const uint64_t directory_end = directory + directory_bytes;
    for (uint64_t i = 0; i < entries; ++i) {
      require_input(at + 46 <= directory_end && le(base + at, 4) == 0x02014b50,
                    "'{}': zip central directory entry {} is damaged or past its end. Re-create the file.", path, i);
      Entry e;
      e.method = static_cast<int>(le(base + at + 10, 2));
      e.crc = static_cast<uint32_t>(le(base + at + 16, 4));
      e.compressed = le(base + at + 20, 4);
      e.size = le(base + at + 24, 4);
      const uint64_t name_bytes = le(base + at + 28, 2), extra_bytes = le(base + at + 30, 2),
                     comment_bytes = le(base + at + 32, 2);
      uint64_t local = le(base + at + 42, 4);
      require_input(at + 46 + name_bytes + extra_bytes + comment_bytes <= directory_end,
                    "'{}': zip central directory entry {} runs past the directory. Re-create the file.", path, i);
      const std::string name(reinterpret_cast<const char*>(base + at + 46), name_bytes);
      // The zip64 extra field holds, in order, the 64-bit values of the fields that read 0xFFFFFFFF.
      for (uint64_t x = at + 46 + name_bytes; x + 4 <= at + 46 + name_bytes + extra_bytes;) {
        const uint64_t id = le(base + x, 2), length = le(base + x + 2, 2);
        uint64_t field = x + 4;
        const uint64_t field_end = std::min(field + length, at + 46 + name_bytes + extra_bytes);
        if (id == 0x0001) {
          for (uint64_t* value : {&e.size, &e.compressed, &local})
            if (*value == 0xFFFFFFFF && field + 8 <= field_end) {
              *value = le(base + field, 8);
              field += 8;
            }
        }
        x += 4 + length;
      }
      at += 46 + name_bytes + extra_bytes + comment_bytes;
      require_input(name.size() > 4 && name.compare(name.size() - 4, 4, ".npy") == 0,
                    "'{}': the zip entry '{}' is not a .npy array; a .npz dump holds only arrays.", path, name);
      e.array = name.substr(0, name.size() - 4);
      require_input(e.method == 0 || e.method == 8,
                    "'{}': array {} is stored with zip method {}; attnprobe reads stored (0) and deflated (8) "
                    "entries. Re-save it with numpy.savez or savez_compressed.",
                    path, e.array, e.method);
      require_input(e.method != 0 || e.compressed == e.size,
                    "'{}': array {} is stored uncompressed but its zip sizes differ ({} and {}). Re-create the file.",
                    path, e.array, e.compressed, e.size);
      require_input(local <= size && size - local >= 30 && le(base + local, 4) == 0x04034b50,
                    "'{}': the zip local header of array {} (offset {}) is past the end of the file or damaged: the "
                    "file is truncated. Re-create or re-copy it.",
                    path, e.array, local);
      e.data = local + 30 + le(base + local + 26, 2) + le(base + local + 28, 2);
      // Deflate expands at most about 1032:1; a larger declared size is a damaged (or hostile) entry,
      // refused before anything of that size is allocated.
      require_input(e.method == 0 || e.size / 1032 <= e.compressed + 64,
                    "'{}': array {} declares {} bytes from {} deflated bytes, more than deflate can produce. The "
                    "file is damaged: re-create or re-copy it.",
                    path, e.array, e.size, e.compressed);
      require_input(e.data <= size && e.compressed <= size - e.data,
                    "'{}': array {} needs {} bytes from offset {}, but the file has {} bytes: it is truncated. "
                    "Re-create or re-copy it.",
                    path, e.array, e.compressed, e.data, size);
      parse_npy_header(e);
      // Two entries of one name: numpy.load keeps the last, a first-match reader the first, so the file
      // means different data to different readers.
      const std::string array = e.array;
      require_input(entries_.emplace(array, std::move(e)).second,
                    "'{}': the zip holds two entries named {}.npy; numpy would read the last, so which one is "
                    "meant is unclear. Re-create the file.",
                    path, array);
    }
  }

  std::string format() const override { return "npz"; }
  std::string noun() const override { return "array"; }

  std::vector<std::string> array_names() const override {
    std::vector<std::string> names;
    for (const auto& [name, e] : entries_) names.push_back(name);
    return names;
  }
  bool has_tensor(const std::string& name) const override { return entries_.count(name) > 0; }

  TensorInfo tensor(const std::string& name) const override {
    const Entry& e = entries_.at(name);
    TensorInfo info;
    info.shape = e.shape;
    info.dtype = e.type ? raw_type_name(*e.type) : e.descr;
    info.floating = e.type && raw_type_floating(*e.type);
    info.integer = e.type && !raw_type_floating(*e.type);
    info.compressed = e.method == 8;
    return info;
  }

  std::optional<double> number_attribute(const std::string& group, const std::string& name) const override {
    const std::string key = member_name(group, name);
    const auto it = entries_.find(key);
    if (it == entries_.end()) return std::nullopt;
    const Entry& e = it->second;
    require_input(e.type && e.shape.empty(),
                  "'{}': array {} must be one number (a 0-d float or integer array), but it is {} of shape [{}]. "
                  "Write it as numpy.array(value).",
                  path_, key, e.descr, fmt::join(e.shape, ", "));
    double value = 0;
    read(key, {}, {}, &value);
    return value;
  }

  std::string string_attribute(const std::string& name) const override {
    const auto it = entries_.find(name);
    if (it == entries_.end() || it->second.descr.size() < 3 || it->second.descr.compare(0, 2, "<U") != 0 ||
        !it->second.shape.empty())
      return "";
    const Entry& e = it->second;
    const unsigned char* data = bytes(e);
    std::string text;  // UCS-4 little-endian code points; non-ASCII shown as '?'
    for (uint64_t i = 0; i + 4 <= e.size - e.header_bytes; i += 4) {
      const uint64_t c = le(data + e.header_bytes + i, 4);
      if (c == 0) break;
      text.push_back(c < 128 ? static_cast<char>(c) : '?');
    }
    return text;
  }

  void read(const std::string& name, const std::vector<int64_t>& start, const std::vector<int64_t>& count,
            double* out) const override {
    const Entry& e = entries_.at(name);
    require_input(e.type.has_value(), "'{}': array {} has the type '{}', which attnprobe does not read.", path_, name,
                  e.descr);
    read_raw_block(bytes(e) + e.header_bytes, *e.type, e.shape, start, count, out);
  }

 private:
  // The first `want` bytes of an entry's .npy (all of it for want = e.size), inflated if needed.
  std::vector<unsigned char> inflate_prefix(const Entry& e, uint64_t want) const {
    std::vector<unsigned char> out(want);
    z_stream z{};
    require_input(inflateInit2(&z, -MAX_WBITS) == Z_OK, "'{}': zlib cannot start inflating array {}.", path_, e.array);
    z.next_in = const_cast<unsigned char*>(file_.data() + e.data);
    uint64_t in_left = e.compressed, produced = 0;
    int status = Z_OK;
    while (produced < want && status == Z_OK) {
      const uInt in_chunk = static_cast<uInt>(std::min<uint64_t>(in_left, 1u << 30));
      const uInt out_chunk = static_cast<uInt>(std::min<uint64_t>(want - produced, 1u << 30));
      z.avail_in = in_chunk;
      z.next_out = out.data() + produced;
      z.avail_out = out_chunk;
      status = inflate(&z, Z_NO_FLUSH);
      const uint64_t consumed = in_chunk - z.avail_in, made = out_chunk - z.avail_out;
      in_left -= consumed;
      produced += made;
      if (consumed == 0 && made == 0) break;  // no progress: the stream ends early (Z_BUF_ERROR)
    }
    const char* message = z.msg;
    inflateEnd(&z);
    require_input(produced == want && (status == Z_OK || status == Z_STREAM_END),
                  "'{}': array {} is not a valid deflate stream ({} of {} bytes inflated{}{}). The file is damaged: "
                  "re-create or re-copy it.",
                  path_, e.array, produced, want, message ? ": " : "", message ? message : "");
    return out;
  }

  // The whole .npy of an entry, CRC-checked, inflated once; pointers stay valid (the map is fixed).
  const unsigned char* bytes(const Entry& e) const {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!e.checked) {
      if (e.method == 8) e.inflated = inflate_prefix(e, e.size);
      const unsigned char* data = e.method == 8 ? e.inflated.data() : file_.data() + e.data;
      uLong crc = crc32(0L, Z_NULL, 0);
      for (uint64_t done = 0; done < e.size;) {
        const uInt chunk = static_cast<uInt>(std::min<uint64_t>(e.size - done, 1u << 30));
        crc = crc32(crc, data + done, chunk);
        done += chunk;
      }
      require_input(static_cast<uint32_t>(crc) == e.crc,
                    "'{}': array {} fails its CRC-32 check (stored {:08x}, computed {:08x}): the file is damaged. "
                    "Re-create or re-copy it.",
                    path_, e.array, e.crc, static_cast<uint32_t>(crc));
      e.checked = true;
    }
    return e.method == 8 ? e.inflated.data() : file_.data() + e.data;
  }

  // The .npy preamble: "\x93NUMPY", version, header length (2 bytes in 1.x, 4 in 2.x/3.x), then a
  // Python dict literal {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }.
  void parse_npy_header(Entry& e) const {
    auto fail = [&](const std::string& why) {
      return InputError(
          fmt::format("'{}': array {} has a malformed .npy header ({}). Re-save it with numpy.", path_, e.array, why));
    };
    const uint64_t peek = std::min<uint64_t>(e.size, 12);
    std::vector<unsigned char> head =
        e.method == 8 ? inflate_prefix(e, peek)
                      : std::vector<unsigned char>(file_.data() + e.data, file_.data() + e.data + peek);
    if (peek < 10 || std::memcmp(head.data(), "\x93NUMPY", 6) != 0) throw fail("no \\x93NUMPY magic");
    const int major = head[6];
    if (major < 1 || major > 3) throw fail(fmt::format("version {}", major));
    const uint64_t preamble = major == 1 ? 10 : 12;
    if (peek < preamble) throw fail("truncated");
    const uint64_t length = le(head.data() + 8, major == 1 ? 2 : 4);
    if (length > 1'000'000 || preamble + length > e.size) throw fail(fmt::format("header length {}", length));
    e.header_bytes = preamble + length;
    const std::vector<unsigned char> full =
        e.method == 8 ? inflate_prefix(e, e.header_bytes)
                      : std::vector<unsigned char>(file_.data() + e.data, file_.data() + e.data + e.header_bytes);
    const std::string dict(reinterpret_cast<const char*>(full.data()) + preamble, length);
    auto value_of = [&](const char* key) {
      const size_t at = dict.find(fmt::format("'{}':", key));
      if (at == std::string::npos) throw fail(fmt::format("no '{}'", key));
      size_t v = at + std::strlen(key) + 3;
      while (v < dict.size() && dict[v] == ' ') ++v;
      return v;
    };
    size_t v = value_of("descr");
    if (v >= dict.size() || dict[v] != '\'') throw fail("descr is not a string");
    const size_t close = dict.find('\'', v + 1);
    if (close == std::string::npos) throw fail("descr is not closed");
    e.descr = dict.substr(v + 1, close - v - 1);
    static const std::map<std::string, RawType> kDescr = {{"<f2", RawType::kFloat16},
                                                          {"<f4", RawType::kFloat32},
                                                          {"<f8", RawType::kFloat64},
                                                          {"<i4", RawType::kInt32},
                                                          {"<i8", RawType::kInt64}};
    const bool text = e.descr.size() > 2 && e.descr.compare(0, 2, "<U") == 0;
    if (const auto it = kDescr.find(e.descr); it != kDescr.end()) e.type = it->second;
    require_input(e.type || text,
                  "'{}': array {} has the numpy type '{}'; attnprobe reads '<f2', '<f4', '<f8' (q, k, v, dy, scale) "
                  "and '<i4', '<i8' (lengths, causal), little-endian.",
                  path_, e.array, e.descr);
    v = value_of("fortran_order");
    require_input(dict.compare(v, 5, "False") == 0,
                  "'{}': array {} is stored in Fortran (column-major) order; attnprobe reads C order. Re-save it "
                  "with numpy.ascontiguousarray.",
                  path_, e.array);
    v = value_of("shape");
    if (v >= dict.size() || dict[v] != '(') throw fail("shape is not a tuple");
    const size_t end = dict.find(')', v);
    if (end == std::string::npos) throw fail("shape is not closed");
    for (size_t p = v + 1; p < end;) {
      while (p < end && (dict[p] == ' ' || dict[p] == ',')) ++p;
      if (p >= end) break;
      int64_t d = 0;
      const auto [next, ec] = std::from_chars(dict.data() + p, dict.data() + end, d);
      if (ec != std::errc() || d < 0) throw fail("shape holds something other than non-negative integers");
      e.shape.push_back(d);
      p = static_cast<size_t>(next - dict.data());
    }
    size_t element = e.type ? raw_type_size(*e.type) : 0;
    if (text) {
      int chars = 0;
      std::from_chars(e.descr.data() + 2, e.descr.data() + e.descr.size(), chars);
      element = 4 * static_cast<size_t>(std::max(chars, 0));
    }
    const std::optional<uint64_t> need = raw_byte_count(e.shape, element);
    require_input(need && *need == e.size - e.header_bytes,
                  "'{}': array {} is '{}' of shape [{}], which needs {} bytes, but its .npy holds {} after the "
                  "header. Re-create the file.",
                  path_, e.array, e.descr, fmt::join(e.shape, ", "),
                  need ? fmt::format("{}", *need) : std::string("more than 2^64"), e.size - e.header_bytes);
  }

  std::string path_;
  MappedFile file_;
  std::map<std::string, Entry> entries_;
  mutable std::mutex mutex_;
};

}  // namespace

std::unique_ptr<Container> open_npz_container(const std::string& path) { return std::make_unique<NpzContainer>(path); }

}  // namespace attnprobe
