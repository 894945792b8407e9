#pragma once
// Reading the dump layout of docs/dumps.md from any container (HDF5, safetensors, .npz; chosen by
// the file's magic bytes, container.h), lazily: opening a dump reads only shapes and attributes;
// read_slice() reads the block of one (layer, head, batch item, prefix length).
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

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
  int number = 0;                      ///< NN of layer_NN (0 for explicit paths)
  std::string name;                    ///< group name, e.g. "layer_03" ("/" for the root)
  std::string group;                   ///< the container's group of its attributes ("" for the root)
  std::string q_path, k_path, v_path;  ///< array names in the container ("/layer_03/q", "layer_03.q")
  std::string layout;                  ///< resolved layout letters
  std::string dtype;                   ///< bfloat16 | float16 | float32 | float64 (of q)
  bool compressed = false;             ///< any filter (e.g. gzip, deflate) on q
  int64_t batch = 1, heads = 1;        ///< B, H (query heads)
  int64_t kv_heads = 1;                ///< Hkv of k and v, dividing H: query head h reads kv head h / (H / Hkv)
  int64_t tokens = 0;                  ///< Nq: query rows per batch item
  int64_t key_tokens = 0;              ///< Nk of k and v: Nq for self-attention, more for a decode dump
  int64_t dim = 0, value_dim = 0;      ///< P, Pv
  double scale = 0;                    ///< attribute or 1/sqrt(P)
  bool scale_from_file = false;
  std::optional<int> causal;      ///< attribute: the mask `--mask auto` chooses
  std::optional<int64_t> window;  ///< attribute `window` (with causal = 1: `--mask auto` is window:W)
  bool cross = false;             ///< attribute `cross` = 1: cross-attention (queries have no positions)
  /// layer_NN/q_positions per batch item ([Nq] or [B, Nq] in the file), empty when absent: query row i of item b
  /// is then at lengths[b] − Nq + i (bottom-right, FlashAttention's convention for Nq ≠ Nk).
  std::vector<std::vector<int64_t>> q_positions;

  /// Whether the layer stores its own query rows: fewer than its keys (a decode step), or cross-attention.
  /// Its cases evaluate those rows (`queries` = dump) against each item's whole valid cache.
  bool own_queries() const { return cross || tokens != key_tokens; }
  std::vector<int64_t> lengths;  ///< valid tokens per batch item (N when absent)
  bool has_lengths = false;
  std::string dy_path;  ///< layer_NN/dy ([B, H, N, Pv]: real upstream gradients), "" when absent
  /// Score shaping (docs/dumps.md, "Score shaping"): attribute `softcap` (0: none) and `bias_before_softcap`,
  /// layer_NN/alibi_slopes [H] (empty when absent), layer_NN/bias ([Nq, Nk], [H|1, Nq, Nk] or [B|1, H|1, Nq, Nk];
  /// "" when absent, its shape in bias_shape).
  double softcap = 0;
  bool bias_before_softcap = false;
  std::vector<double> alibi_slopes;
  std::string bias_path;
  std::vector<int64_t> bias_shape;
  bool shaped() const { return softcap > 0 || !alibi_slopes.empty() || !bias_path.empty(); }
  std::string shaping() const { return shaping_description(softcap, !alibi_slopes.empty(), !bias_path.empty()); }
  /// The rotary embedding's inverse frequencies θ_f (docs/dumps.md, "Rotary frequencies"): layer_NN/rope_inv_freq
  /// [P/2] with the root attribute rope_layout = "half"; null when the layer has none.
  std::shared_ptr<const std::vector<double>> rope_inv_freq;
};

class Container;

class Dump {
 public:
  /// Opens and checks the structure (not the values). Throws InputError with a message that
  /// names the file, the dataset and what to do.
  static Dump open(const std::string& path, const DumpOptions& options = {});

  const std::string& path() const { return path_; }
  const std::string& format() const { return format_; }  ///< HDF5 | safetensors | npz
  const std::vector<LayerInfo>& layers() const { return layers_; }
  const LayerInfo& layer(int number) const;                   ///< by layer number; throws InputError if absent
  std::string root_attribute(const std::string& name) const;  ///< "" when absent
  /// The file's contents (common/digest.h, file_digest) and how its layers are read (layout, dtype, shapes,
  /// scale, mask attributes): equal fingerprints give equal slices, within file_digest's sampling of files
  /// over 64 MiB. Reads the file (all of it up to 64 MiB, 4 MiB of a larger one).
  std::string fingerprint() const;

  /// Reads the prefix of n tokens of one (query) head of one batch item; k and v come from the
  /// head's kv head h / (H / Hkv). n must be ≤ the item's valid length; a layer with its own query rows
  /// (own_queries()) reads all of them against the whole valid cache (n must be that length), at their
  /// positions. Values are checked: NaN/Inf throws InputError naming layer, head, batch and token.
  HeadView read_slice(int layer, int head, int batch, int64_t n) const;
  /// The query rows alone that read_slice would read (the same checks, rows and positions), for the other heads of
  /// a kv group whose scores a group-shared estimator aggregates: their keys and values are the slice's own.
  MatrixD read_queries(int layer, int head, int batch, int64_t n) const;
  /// The keys alone that read_slice would read for query head `head` (its kv head's; the same checks), for the other
  /// kv heads of a layer whose heads share one kept set (tova(heads=layer)).
  MatrixD read_keys(int layer, int head, int batch, int64_t n) const;
  /// The prefix of n rows of layer_NN/dy (n × Pv, upstream gradients of the attention output, for
  /// the gradient metrics), or nullopt when the layer has none. Same checks as read_slice.
  std::optional<MatrixD> read_upstream(int layer, int head, int batch, int64_t n) const;

 private:
  /// The layer of slice (layer, head, batch item, length n) after checking that it exists (InputError otherwise).
  const LayerInfo& checked_slice(int layer, int head, int batch, int64_t n) const;
  void read_block(const std::string& tensor, const LayerInfo& info, int head, int batch, int64_t n, int64_t width,
                  MatrixD& out) const;
  /// The additive bias of query head `head`, batch item `batch`: its first `rows` query rows × first `keys` keys.
  std::shared_ptr<const MatrixD> read_bias(const LayerInfo& info, int head, int batch, int64_t rows,
                                           int64_t keys) const;

  std::string path_, format_;
  int num_heads_split_ = 0;
  std::shared_ptr<const Container> container_;
  std::vector<LayerInfo> layers_;
};

}  // namespace attnprobe
