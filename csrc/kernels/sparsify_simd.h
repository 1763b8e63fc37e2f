// The sparsification primitives (sparsify_isa.h) written once over the vector operations `V`
// and compiled per ISA (sparsify_avx2.cc, sparsify_avx512.cc).
//
// select / select_ef, per vector of kLanes elements:
//   1. keys = |v| bits; mask = (keys > t) | (keys == t while the equal-key budget lasts)
//   2. mask == 0 (the common case at 1% density): next vector
//   3. else walk the set bits in lane order (the scalar reference's order) and append pairs
// Cost: one read of x (+ read and write of e for select_ef), ~5 vector ops per vector; the
// appends are scalar but touch only the ~k selected elements.
// scatter_add stays a plain loop in every copy: it is bound by random access to y, and indices
// may repeat (a SIMD scatter would need conflict detection for no gain).
namespace {

template <class Load>
std::size_t select_t(Load load, std::size_t n, std::uint32_t t, std::size_t eq_budget, std::uint32_t* idx,
                     float* val, std::size_t cap) {
  constexpr std::size_t kL = V::kLanes;
  std::size_t count = 0, eq = 0;
  auto offer = [&](std::size_t i, float v) {
    const std::uint32_t k = qmath::abs_bits(v);
    if (k < t || (k == t && eq >= eq_budget)) return;
    if (k == t) ++eq;
    if (count < cap) {
      idx[count] = static_cast<std::uint32_t>(i);
      val[count] = v;
    }
    ++count;
  };
  std::size_t i = 0;
  for (; i + kL <= n; i += kL) {
    const V::F v = load(i);
    const V::I keys = V::abs_bits(v);
    const V::Mask gt = V::gt_u32(keys, t);
    const V::Mask m = eq < eq_budget ? gt | V::eq_u32(keys, t) : gt;
    if (m == 0) continue;
    alignas(64) float lanes[kL];
    V::store(lanes, v);
    if (m == gt && count + kL <= cap) {  // no equal keys involved: append directly
      for (V::Mask b = m; b != 0; b &= b - 1) {
        const int j = __builtin_ctz(b);
        idx[count] = static_cast<std::uint32_t>(i + j);
        val[count++] = lanes[j];
      }
      continue;
    }
    for (V::Mask b = m; b != 0; b &= b - 1) offer(i + __builtin_ctz(b), lanes[__builtin_ctz(b)]);
  }
  for (; i < n; ++i) offer(i, load.at(i));
  return count;
}

struct LoadX {
  const float* x;
  V::F operator()(std::size_t i) const { return V::load(x + i); }
  float at(std::size_t i) const { return x[i]; }
};

struct LoadEf {  // r = g + e, stored back to e
  const float* g;
  float* e;
  V::F operator()(std::size_t i) const {
    const V::F r = V::add(V::load(g + i), V::load(e + i));
    V::store(e + i, r);
    return r;
  }
  float at(std::size_t i) const {
    const float r = g[i] + e[i];
    e[i] = r;
    return r;
  }
};

}  // namespace

std::size_t select(const float* x, std::size_t n, std::uint32_t t, std::size_t eq_budget, std::uint32_t* idx,
                   float* val, std::size_t cap) {
  return select_t(LoadX{x}, n, t, eq_budget, idx, val, cap);
}

std::size_t select_ef(const float* g, float* e, std::size_t n, std::uint32_t t, std::size_t eq_budget,
                      std::uint32_t* idx, float* val, std::size_t cap) {
  return select_t(LoadEf{g, e}, n, t, eq_budget, idx, val, cap);
}

void scatter_add(float* y, const std::uint32_t* idx, const float* val, std::size_t m) {
  for (std::size_t i = 0; i < m; ++i) y[idx[i]] = y[idx[i]] + val[i];
}
