#pragma once
// Test-only writers of the raw bytes of safetensors files, .npy arrays and zip (.npz) archives, so
// tests can build valid containers and then damage exactly one field (docs/dumps.md, "Containers").
// Written independently of the readers in lib/attnprobe/io (the same format documents, other code).
#include <zlib.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace attnprobe::test {

/// Little-endian bytes of `count` bytes of an integer.
inline std::string le_bytes(uint64_t value, int count) {
  std::string out;
  for (int i = 0; i < count; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
  return out;
}

template <class T>
std::string raw_bytes(const std::vector<T>& values) {
  std::string out(values.size() * sizeof(T), '\0');
  if (!values.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

/// One tensor of a safetensors file: its dtype name (BF16, F32, ...), shape and raw bytes.
struct StTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

/// A safetensors file: 8-byte header length, JSON header (data_offsets in order), the bytes.
/// `header_override`, when not empty, replaces the JSON (to write damaged headers).
inline std::string safetensors_file(const std::vector<StTensor>& tensors,
                                    const std::map<std::string, std::string>& metadata,
                                    const std::string& header_override = "") {
  std::string json = "{";
  if (!metadata.empty()) {
    json += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : metadata) {
      json += fmt::format("{}\"{}\":\"{}\"", first ? "" : ",", k, v);
      first = false;
    }
    json += "}";
  }
  uint64_t offset = 0;
  std::string data;
  for (const StTensor& t : tensors) {
    if (json.size() > 1) json += ",";
    json += fmt::format("\"{}\":{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}", t.name, t.dtype,
                        fmt::join(t.shape, ","), offset, offset + t.bytes.size());
    offset += t.bytes.size();
    data += t.bytes;
  }
  json += "}";
  if (!header_override.empty()) json = header_override;
  while (json.size() % 8) json += ' ';
  return le_bytes(json.size(), 8) + json + data;
}

/// A .npy (version 1.0) of `descr` ('<f4', ...), `shape` and raw bytes.
inline std::string npy_bytes(const std::string& descr, const std::vector<int64_t>& shape, const std::string& bytes,
                             bool fortran = false) {
  std::string shape_text = "(";
  for (int64_t d : shape) shape_text += fmt::format("{}, ", d);
  if (shape.size() > 1) shape_text.resize(shape_text.size() - 2);
  if (shape.size() == 1) shape_text.resize(shape_text.size() - 1);  // "(3,)"
  shape_text += ")";
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': {}, 'shape': {}, }}", descr,
                                   fortran ? "True" : "False", shape_text);
  while ((10 + header.size() + 1) % 64) header += ' ';
  header += '\n';
  return std::string("\x93NUMPY\x01\x00", 8) + le_bytes(header.size(), 2) + header + bytes;
}

/// A zip archive of `entries` (name → bytes), each stored (method 0) or raw-deflated (method 8).
inline std::string zip_file(const std::vector<std::pair<std::string, std::string>>& entries, bool deflated) {
  std::string out, directory;
  for (const auto& [name, content] : entries) {
    const uint32_t crc = static_cast<uint32_t>(
        crc32(0L, reinterpret_cast<const Bytef*>(content.data()), static_cast<uInt>(content.size())));
    std::string stored = content;
    if (deflated) {
      z_stream z{};
      deflateInit2(&z, 6, Z_DEFLATED, -MAX_WBITS, 8, Z_DEFAULT_STRATEGY);
      stored.assign(deflateBound(&z, content.size()), '\0');
      z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(content.data()));
      z.avail_in = static_cast<uInt>(content.size());
      z.next_out = reinterpret_cast<Bytef*>(stored.data());
      z.avail_out = static_cast<uInt>(stored.size());
      ::deflate(&z, Z_FINISH);
      stored.resize(z.total_out);
      deflateEnd(&z);
    }
    const uint64_t local = out.size();
    const std::string common = le_bytes(20, 2) + le_bytes(0, 2) + le_bytes(deflated ? 8 : 0, 2) + le_bytes(0, 4) +
                               le_bytes(crc, 4) + le_bytes(stored.size(), 4) + le_bytes(content.size(), 4) +
                               le_bytes(name.size(), 2) + le_bytes(0, 2);
    out += le_bytes(0x04034b50, 4) + common + name + stored;
    directory += le_bytes(0x02014b50, 4) + le_bytes(20, 2) + common + le_bytes(0, 2) + le_bytes(0, 2) + le_bytes(0, 2) +
                 le_bytes(0, 4) + le_bytes(local, 4) + name;
  }
  const uint64_t at = out.size();
  out += directory + le_bytes(0x06054b50, 4) + le_bytes(0, 2) + le_bytes(0, 2) + le_bytes(entries.size(), 2) +
         le_bytes(entries.size(), 2) + le_bytes(directory.size(), 4) + le_bytes(at, 4) + le_bytes(0, 2);
  return out;
}

}  // namespace attnprobe::test
