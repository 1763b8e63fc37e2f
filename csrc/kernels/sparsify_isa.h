// The per-ISA primitives behind kernels/sparsify.h (the selection logic itself, sampling and
// nth_element, is ISA-independent and lives in sparsify.cc). Arguments are trusted.
//
//   select(x, n, t, eq_budget, idx, val, cap)
//       keeps i when key(x[i]) > t, or key(x[i]) == t and fewer than eq_budget equal keys were
//       kept before it (eq_budget = SIZE_MAX: all of them); key = |x| bit pattern (uint32).
//       Writes the first min(count, cap) pairs in index order; returns count.
//   select_ef(g, e, ...)  the same on r = g + e, storing e[i] = r for every i.
//   scatter_add(y, idx, val, m)  y[idx[i]] += val[i], in order.
#pragma once
#include <cstddef>
#include <cstdint>

#define ZCOLL_SPARSIFY_ISA_API                                                                           \
  std::size_t select(const float* x, std::size_t n, std::uint32_t t, std::size_t eq_budget,              \
                     std::uint32_t* idx, float* val, std::size_t cap);                                   \
  std::size_t select_ef(const float* g, float* e, std::size_t n, std::uint32_t t, std::size_t eq_budget, \
                        std::uint32_t* idx, float* val, std::size_t cap);                                \
  void scatter_add(float* y, const std::uint32_t* idx, const float* val, std::size_t m);

namespace zcoll::kernels {
namespace scalar {
ZCOLL_SPARSIFY_ISA_API
}  // namespace scalar
namespace avx2 {
ZCOLL_SPARSIFY_ISA_API
}  // namespace avx2
namespace avx512 {
ZCOLL_SPARSIFY_ISA_API
}  // namespace avx512
}  // namespace zcoll::kernels
