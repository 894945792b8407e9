// The safetensors container (docs/dumps.md): an 8-byte little-endian header length, a JSON header
// {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {string: string}}, then the
// raw little-endian bytes of every tensor (offsets relative to the end of the header). The file is
// memory-mapped; opening parses and validates only the header (every offset against the file size,
// no overlaps, shape × dtype = byte count), so a block read never touches a byte past the end.
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "attnprobe/common/error.h"
#include "attnprobe/io/container.h"
#include "attnprobe/io/raw_array.h"

namespace attnprobe {

namespace {

// The reference implementation refuses headers over 100 MB; a longer one is a damaged length.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// A safetensors header nests three levels (object → entry → shape array); anything deeper is not one.
// Parsing deep JSON is safe, but printing it (a message quoting an entry) recursed once per level and
// overflowed the stack at ~100k levels.
constexpr int kMaxHeaderDepth = 16;

// Every dtype of the safetensors format and its size; only the first six are read as numbers.
struct DtypeEntry {
  const char* name;
  size_t size;
  std::optional<RawType> type;
};
constexpr DtypeEntry kDtypes[] = {
    {"BF16", 2, RawType::kBFloat16}, {"F16", 2, RawType::kFloat16}, {"F32", 4, RawType::kFloat32},
    {"F64", 8, RawType::kFloat64},   {"I32", 4, RawType::kInt32},   {"I64", 8, RawType::kInt64},
    {"BOOL", 1, std::nullopt},       {"U8", 1, std::nullopt},       {"I8", 1, std::nullopt},
    {"F8_E5M2", 1, std::nullopt},    {"F8_E4M3", 1, std::nullopt},  {"I16", 2, std::nullopt},
    {"U16", 2, std::nullopt},        {"U32", 4, std::nullopt},      {"U64", 8, std::nullopt}};

// A first pass over the header's JSON events that refuses what the tree would hide or cost: nesting deeper
// than kMaxHeaderDepth, and a key twice in one object (the tree keeps the last, so a second "layer_00.q" or
// "__metadata__" entry would silently win). Linear in the header: nlohmann's parse callback instead scans
// the parent object at every member's end, minutes for a header of tens of thousands of tensors.
class HeaderChecker final : public nlohmann::json_sax<nlohmann::json> {
 public:
  explicit HeaderChecker(const std::string& path) : path_(path) {}
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    open();
    keys_.emplace_back();
    return true;
  }
  bool key(string_t& name) override {
    const bool top = keys_.size() == 1, in_metadata = keys_.size() == 2 && metadata_open_;
    require_input(keys_.back().insert(name).second,
                  "'{}': the safetensors header names {} '{}' twice; which one is meant cannot be told. Re-create "
                  "the file.",
                  path_,
                  top           ? "the entry"
                  : in_metadata ? "the __metadata__ key"
                                : "the field",
                  name);
    if (top) next_is_metadata_ = name == "__metadata__";
    return true;
  }
  bool end_object() override {
    keys_.pop_back();
    --depth_;
    if (keys_.size() == 1) metadata_open_ = false;
    return true;
  }
  bool start_array(std::size_t) override {
    open();
    return true;
  }
  bool end_array() override {
    --depth_;
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    throw InputError(
        fmt::format("'{}': the safetensors header is not JSON ({}). Re-create the file.", path_, e.what()));
  }

 private:
  void open() {
    require_input(depth_ < kMaxHeaderDepth,
                  "'{}': the safetensors header nests deeper than {} levels; a safetensors header has three. "
                  "Re-create the file.",
                  path_, kMaxHeaderDepth);
    // The object opened as the value of the top-level "__metadata__" key.
    if (depth_ == 1 && next_is_metadata_) metadata_open_ = true;
    ++depth_;
  }
  const std::string& path_;
  std::vector<std::set<std::string>> keys_;  ///< per open object, the keys seen
  int depth_ = 0;                            ///< open objects and arrays
  bool next_is_metadata_ = false, metadata_open_ = false;
};

struct Tensor {
  std::string dtype_name;
  std::optional<RawType> type;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // absolute byte offsets in the file
};

class SafetensorsContainer final : public DottedContainer {
 public:
  explicit SafetensorsContainer(const std::string& path) : path_(path), file_(path) {
    const uint64_t size = file_.size();
    require_input(size >= 8,
                  "'{}' is too short for a safetensors file ({} bytes; the 8-byte header length alone needs 8). The "
                  "file is truncated: re-create or re-copy it.",
                  path, size);
    uint64_t header_bytes = 0;
    std::memcpy(&header_bytes, file_.data(), 8);
    require_input(header_bytes >= 2 && header_bytes <= kMaxHeaderBytes && header_bytes <= size - 8,
                  "'{}': the safetensors header length is {} bytes, but the file has {} bytes after it{}. The file is "
                  "truncated or not safetensors: re-create or re-copy it.",
                  path, header_bytes, size - 8,
                  header_bytes > kMaxHeaderBytes ? fmt::format(" (and at most {} are allowed)", kMaxHeaderBytes) : "");
    const uint64_t data_start = 8 + header_bytes, data_bytes = size - data_start;
    const char* header_text = reinterpret_cast<const char*>(file_.data()) + 8;
    const char* header_end = reinterpret_cast<const char*>(file_.data()) + data_start;
    HeaderChecker checker(path);
    nlohmann::json::sax_parse(header_text, header_end, &checker);
    nlohmann::json header;
    try {
      header = nlohmann::json::parse(header_text, header_end);
    } catch (const nlohmann::json::exception& e) {
      throw InputError(
          fmt::format("'{}': the safetensors header is not JSON ({}). Re-create the file.", path, e.what()));
    }
    require_input(header.is_object(), "'{}': the safetensors header is JSON but not an object. Re-create the file.",
                  path);
    for (const auto& [name, entry] : header.items()) {
      if (name == "__metadata__") {
        require_input(entry.is_object(), "'{}': the safetensors __metadata__ is not an object of strings.", path);
        for (const auto& [key, value] : entry.items()) {
          require_input(value.is_string(), "'{}': the safetensors __metadata__ value of '{}' is not a string ({}).",
                        path, key, value.dump());
          metadata_[key] = value.get<std::string>();
        }
        continue;
      }
      require_input(entry.is_object() && entry.contains("dtype") && entry["dtype"].is_string() &&
                        entry.contains("shape") && entry["shape"].is_array() && entry.contains("data_offsets") &&
                        entry["data_offsets"].is_array() && entry["data_offsets"].size() == 2,
                    "'{}': the safetensors header entry of tensor {} is not {{\"dtype\", \"shape\", \"data_offsets\": "
                    "[begin, end]}} ({}).",
                    path, name, entry.dump().substr(0, 200));
      Tensor t;
      t.dtype_name = entry["dtype"].get<std::string>();
      const DtypeEntry* dtype = nullptr;
      for (const DtypeEntry& d : kDtypes)
        if (t.dtype_name == d.name) dtype = &d;
      require_input(dtype != nullptr,
                    "'{}': tensor {} has the unknown safetensors dtype '{}' (known: BF16, F16, F32, F64, I32, I64, "
                    "BOOL, U8, I8, I16, U16, U32, U64, F8_E5M2, F8_E4M3).",
                    path, name, t.dtype_name);
      t.type = dtype->type;
      for (const auto& d : entry["shape"]) {
        require_input(d.is_number_unsigned() || (d.is_number_integer() && d.get<int64_t>() >= 0),
                      "'{}': tensor {} has a shape entry {} that is not a non-negative integer.", path, name, d.dump());
        const uint64_t value = d.get<uint64_t>();
        require_input(value <= static_cast<uint64_t>(INT64_MAX), "'{}': tensor {} has a dimension {} beyond 2^63.",
                      path, name, value);
        t.shape.push_back(static_cast<int64_t>(value));
      }
      const auto& offsets = entry["data_offsets"];
      require_input(offsets[0].is_number_unsigned() && offsets[1].is_number_unsigned(),
                    "'{}': tensor {} has data_offsets {} that are not non-negative integers.", path, name,
                    offsets.dump());
      const uint64_t begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
      require_input(begin <= end && end <= data_bytes,
                    "'{}': tensor {} has data_offsets [{}, {}], past the end of the data ({} bytes after the header) "
                    "or reversed. The file is truncated or damaged: re-create or re-copy it.",
                    path, name, begin, end, data_bytes);
      const std::optional<uint64_t> need = raw_byte_count(t.shape, dtype->size);
      require_input(need && *need == end - begin,
                    "'{}': tensor {} is {} of shape [{}], which needs {} bytes, but its data_offsets [{}, {}] hold {}. "
                    "Re-create the file.",
                    path, name, t.dtype_name, fmt::join(t.shape, ", "),
                    need ? fmt::format("{}", *need) : std::string("more than 2^64"), begin, end, end - begin);
      t.begin = data_start + begin;
      t.end = data_start + end;
      tensors_.emplace(name, std::move(t));
    }
    // No two tensors may share bytes (a writer bug or a crafted file would alias them).
    std::vector<std::pair<const std::string*, const Tensor*>> order;
    for (const auto& [name, t] : tensors_)
      if (t.end > t.begin) order.emplace_back(&name, &t);
    std::sort(order.begin(), order.end(), [](auto& a, auto& b) { return a.second->begin < b.second->begin; });
    for (size_t i = 1; i < order.size(); ++i)
      require_input(order[i].second->begin >= order[i - 1].second->end,
                    "'{}': the tensors {} and {} overlap (bytes {}..{} and {}..{} of the file). Re-create the file.",
                    path, *order[i - 1].first, *order[i].first, order[i - 1].second->begin, order[i - 1].second->end,
                    order[i].second->begin, order[i].second->end);
  }

  std::string format() const override { return "safetensors"; }
  std::string noun() const override { return "tensor"; }

  std::vector<std::string> array_names() const override {
    std::vector<std::string> names;
    for (const auto& [name, t] : tensors_) names.push_back(name);
    return names;
  }
  bool has_tensor(const std::string& name) const override { return tensors_.count(name) > 0; }

  TensorInfo tensor(const std::string& name) const override {
    const Tensor& t = tensors_.at(name);
    TensorInfo info;
    info.shape = t.shape;
    info.dtype = t.type ? raw_type_name(*t.type) : t.dtype_name;
    info.floating = t.type && raw_type_floating(*t.type);
    info.integer = t.type && !raw_type_floating(*t.type);
    return info;
  }

  std::optional<double> number_attribute(const std::string& group, const std::string& name) const override {
    const std::string key = group.empty() ? name : group + "." + name;
    const auto it = metadata_.find(key);
    if (it == metadata_.end()) return std::nullopt;
    double value = 0;
    const std::string& text = it->second;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    require_input(ec == std::errc() && end == text.data() + text.size() && !text.empty(),
                  "'{}': the __metadata__ value {} is '{}', which is not one number. Write it as a decimal number.",
                  path_, key, text);
    return value;
  }
  std::string string_attribute(const std::string& name) const override {
    const auto it = metadata_.find(name);
    return it == metadata_.end() ? "" : it->second;
  }

  void read(const std::string& name, const std::vector<int64_t>& start, const std::vector<int64_t>& count,
            double* out) const override {
    const Tensor& t = tensors_.at(name);
    require_input(t.type.has_value(), "'{}': tensor {} is {}, which attnprobe does not read.", path_, name,
                  t.dtype_name);
    read_raw_block(file_.data() + t.begin, *t.type, t.shape, start, count, out);
  }

 private:
  std::string path_;
  MappedFile file_;
  std::map<std::string, Tensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace

std::unique_ptr<Container> open_safetensors_container(const std::string& path) {
  return std::make_unique<SafetensorsContainer>(path);
}

}  // namespace attnprobe
