#pragma once
// Reading the HDF5 dump layout of docs/dumps.md, lazily: opening a dump reads only shapes and
// attributes; read_slice() reads the hyperslab of one (layer, head, batch item, prefix length).
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attnprobe/io/h5_handle.h"
#include "attnprobe/view/head_view.h"

namespace attnprobe {

/// How to find and interpret q/k/v when a dump does not follow the default layout.
struct DumpOptions {
  std::string q_path, k_path, v_path;  ///< explicit dataset paths (all three or none): one layer
  std::string layout;                  ///< bhnp | bnhp | hnp | nhp | bnp | np; empty = by rank
  int num_heads = 0;                   ///< split the last dim of a layout without 'h' into heads
};

/// Where a layer's tensors live and how their dimensions map to (b, h, n, p).
struct LayerInfo {
  int number = 0;    ///< NN of layer_NN (0 for explicit paths)
  std::string name;  ///< group name, e.g. "layer_03"
  std::string q_path, k_path, v_path;
  std::string layout;              ///< resolved layout letters
  std::string dtype;               ///< float16 | float32 | float64 (of q)
  bool compressed = false;         ///< any filter (e.g. gzip) on q
  int64_t batch = 1, heads = 1;    ///< B, H
  int64_t tokens = 0;              ///< N (queries); keys M == N is required
  int64_t dim = 0, value_dim = 0;  ///< P, Pv
  double scale = 0;                ///< attribute or 1/sqrt(P)
  bool scale_from_file = false;
  std::optional<int> causal;     ///< attribute, informational
  std::vector<int64_t> lengths;  ///< valid tokens per batch item (N when absent)
  bool has_lengths = false;
};

class Dump {
 public:
  /// Opens and checks the structure (not the values). Throws InputError with a message that
  /// names the file, the dataset and what to do.
  static Dump open(const std::string& path, const DumpOptions& options = {});

  const std::string& path() const { return path_; }
  const std::vector<LayerInfo>& layers() const { return layers_; }
  const LayerInfo& layer(int number) const;                   ///< by layer number; throws InputError if absent
  std::string root_attribute(const std::string& name) const;  ///< "" when absent

  /// Reads the prefix of n tokens of one head of one batch item. n must be ≤ the item's valid
  /// length. Values are checked: NaN/Inf throws InputError naming layer, head, batch and token.
  HeadView read_slice(int layer, int head, int batch, int64_t n) const;

 private:
  void read_block(const std::string& dataset, const LayerInfo& info, int head, int batch, int64_t n, int64_t width,
                  MatrixD& out) const;

  std::string path_;
  int num_heads_split_ = 0;
  std::shared_ptr<H5Handle> file_;
  std::vector<LayerInfo> layers_;
};

}  // namespace attnprobe
