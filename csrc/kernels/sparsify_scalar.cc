// The scalar reference of the sparsification primitives (sparsify_isa.h): plain loops, compiled
// without vectorisation; the test oracle of the SIMD copies.
#include "kernels/quant_math.h"
#include "kernels/sparsify_isa.h"

namespace zcoll::kernels::scalar {
namespace {

// Decides element by element whether v (with key k) is kept, in index order.
struct Selector {
  std::uint32_t t;
  std::size_t eq_budget, eq = 0, count = 0;
  void offer(std::size_t i, float v, std::uint32_t* idx, float* val, std::size_t cap) {
    const std::uint32_t k = qmath::abs_bits(v);
    if (k < t || (k == t && eq >= eq_budget)) return;
    if (k == t) ++eq;
    if (count < cap) {
      idx[count] = static_cast<std::uint32_t>(i);
      val[count] = v;
    }
    ++count;
  }
};

}  // namespace

std::size_t select(const float* x, std::size_t n, std::uint32_t t, std::size_t eq_budget, std::uint32_t* idx,
                   float* val, std::size_t cap) {
  Selector s{t, eq_budget};
  for (std::size_t i = 0; i < n; ++i) s.offer(i, x[i], idx, val, cap);
  return s.count;
}

std::size_t select_ef(const float* g, float* e, std::size_t n, std::uint32_t t, std::size_t eq_budget,
                      std::uint32_t* idx, float* val, std::size_t cap) {
  Selector s{t, eq_budget};
  for (std::size_t i = 0; i < n; ++i) {
    const float r = g[i] + e[i];
    e[i] = r;
    s.offer(i, r, idx, val, cap);
  }
  return s.count;
}

void scatter_add(float* y, const std::uint32_t* idx, const float* val, std::size_t m) {
  for (std::size_t i = 0; i < m; ++i) y[idx[i]] = y[idx[i]] + val[i];
}

}  // namespace zcoll::kernels::scalar
