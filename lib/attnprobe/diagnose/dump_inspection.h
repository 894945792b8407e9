#pragma once
// `attnprobe info`'s check of a dump: every slice read in full (the reader refuses NaN and Inf), the
// rows of zero norm counted, and on request each head's mean attention entropy.
#include <cstdint>
#include <vector>

#include "attnprobe/io/dump.h"

namespace attnprobe {

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
