// The per-element rules of the sparsification kernels (kernels/sparsify.h), written once for the
// scalar reference (sparsify_scalar.h) and the vector skeleton (sparsify_simd.h), which calls
// them for the lanes a vector test flagged and for the tail of every loop.
//
//   key(v) = |v| as a bit pattern (qmath::abs_bits): NaN > Inf > finite, -0 == +0.
//   Selector::offer keeps element i when key > t, or key == t and fewer than eq_budget equal
//   keys were kept before it; it writes the first `cap` kept pairs and counts them all.
//   scatter_add_in_order: y[idx[i]] += val[i] for i = 0 .. m-1, in that order.
// Internal linkage (an anonymous namespace): every kernel table keeps its own copy.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/quant_math.h"

namespace zcoll::kernels::smath {
namespace {

struct Selector {
  std::uint32_t t;
  std::size_t eq_budget;
  std::uint32_t* idx;
  float* val;
  std::size_t cap;
  std::size_t eq = 0, count = 0;

  void offer(std::size_t i, float v) {
    const std::uint32_t k = qmath::abs_bits(v);
    if (k < t || (k == t && eq >= eq_budget)) return;
    if (k == t) ++eq;
    append(i, v);
  }
  // For elements known to have key > t.
  void append(std::size_t i, float v) {
    if (count < cap) {
      idx[count] = static_cast<std::uint32_t>(i);
      val[count] = v;
    }
    ++count;
  }
};

// The same plain loop in every table: scatter-add is bound by random access to y, and repeated
// indices would need conflict detection in a SIMD scatter, for no gain.
inline void scatter_add_in_order(float* y, const std::uint32_t* idx, const float* val, std::size_t m) {
  for (std::size_t i = 0; i < m; ++i) y[idx[i]] = y[idx[i]] + val[i];
}

}  // namespace
}  // namespace zcoll::kernels::smath
