#pragma once
// What a head's attention looks like, independent of any estimator (`attnprobe info`): these
// explain why one head is harder to approximate than another.
#include <cstdint>
#include <vector>

#include "attnprobe/io/dump.h"
#include "attnprobe/view/head_view.h"

namespace attnprobe {

/// Mean over queries of the entropy (nats) of the softmax row softmax_j(s·q_i·k_j): ln n for
/// uniform attention, 0 when every query attends to one key. O(n²p), one row at a time.
double mean_attention_entropy(const HeadView& view);

/// The result of reading every slice of a dump in full (values are checked by the reader).
struct DumpInspection {
  struct Head {
    int layer = 0, head = 0;
    double mean_entropy = 0;  ///< mean over batch items of mean_attention_entropy
    double mean_tokens = 0;   ///< mean valid length over batch items (ln of it = uniform entropy)
  };
  int64_t slices = 0;
  int64_t zero_query_rows = 0, zero_key_rows = 0;  ///< rows of zero norm (YOSO hashes them to a fixed code)
  std::vector<Head> heads;                         ///< filled when entropy was asked for
};

DumpInspection inspect_dump(const Dump& dump, bool entropy);

}  // namespace attnprobe
