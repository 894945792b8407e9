#pragma once
// The keys hyper and kdeformer share, in canonical order — m (the samples knob; default and help differ),
// b, r, order — bound to the members of their parameter structs, and the randomness they share: both draw
// nothing with m = 0 samples and r = 0 hash bits (contiguous blocks), so they are deterministic then.
#include <string>
#include <utility>

#include "attnprobe/estimators/capabilities.h"
#include "attnprobe/estimators/param_set.h"
#include "attnprobe/estimators/sorted_lsh/sort_lsh.h"

namespace attnprobe {

/// P has members samples, block, bits and order.
template <class P>
ParamSet<P> sorted_lsh_keys(std::string m_help) {
  return ParamSet<P>()
      .integer("m", &P::samples, 0, 1 << 24, std::move(m_help))
      .integer("b", &P::block, 1, 1 << 24, "block size (b >= n: exact)")
      .integer("r", &P::bits, 0, 30, "hash bits (0: contiguous blocks)")
      .choice("order", &P::order, {{"gray", BucketOrder::kGray}, {"code", BucketOrder::kCode}},
              "bucket order: gray (Gray rank) or code (c xor c>>1, as the reference repos)");
}

template <class P>
void narrow_sorted_lsh(const P& params, Capabilities& can) {
  can.random = params.samples > 0 || params.bits > 0;
}

}  // namespace attnprobe
