// The sparsification passes (kernels/kernel_table.h: select, select_ef) written once over the
// vector operations V (simd_ops.h) and compiled into every SIMD table (kernels_avx2.cc,
// kernels_avx512.cc). Same results as the scalar reference (sparsify_scalar.h): both apply the
// element rule of sparsify_math.h in index order.
//
// Per vector of kLanes elements:
//   1. keys = |v| bits; mask = (keys > t) | (keys == t while the equal-key budget lasts)
//   2. mask == 0 (the common case at 1% density): next vector
//   3. else, when no key equals t and kLanes pairs fit: store the flagged lanes and their indices
//      packed (V::store_packed: a compress on AVX-512, a table permutation on AVX2), advance by
//      their count (branch-free); otherwise walk the set bits in lane order (the scalar
//      reference's order) and offer the pairs
// Cost: one read of x (+ read and write of e for select_ef), ~5 vector ops per vector, ~4 more
// per vector with a selected element.
// Included in the anonymous namespace of kernels_<isa>.cc, after simd_ops.h.

template <class Load>
std::size_t select_t(Load load, std::size_t n, std::uint32_t t, std::size_t eq_budget, std::uint32_t* idx,
                     float* val, std::size_t cap) {
  smath::Selector s{t, eq_budget, idx, val, cap};
  std::size_t i = 0;
  for (; i + kL <= n; i += kL) {
    const V::F v = load(i);
    const V::I keys = V::abs_bits(v);
    const V::Bits gt = V::gt_u32(keys, t);
    const V::Bits m = s.eq < eq_budget ? gt | V::eq_u32(keys, t) : gt;
    if (m == 0) continue;
    if (m == gt && s.count + kL <= s.cap) {
      // Every flagged lane is kept and there is room: pack the flagged lanes and their indices to
      // the front of one full-width store each, advance past them. Which lanes are flagged is as
      // unpredictable as the data, so a branch per set bit (the walk below) mispredicts about once
      // per vector where candidates are dense; a scalar write per lane cost 3.3 cycles per
      // candidate, the packed store 0.8 (AVX-512, 32 K-256 K elements).
      V::store_packed(s.val + s.count, s.idx + s.count, m, v, static_cast<std::uint32_t>(i));
      s.count += static_cast<std::size_t>(__builtin_popcount(m));
      continue;
    }
    alignas(64) float lanes[kL];
    V::store(lanes, v);
    for (V::Bits b = m; b != 0; b &= b - 1) {
      const int j = __builtin_ctz(b);
      if (m == gt)  // no equal keys involved: every flagged lane is kept
        s.append(i + j, lanes[j]);
      else
        s.offer(i + j, lanes[j]);
    }
  }
  for (; i < n; ++i) s.offer(i, load.at(i));
  return s.count;
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

std::size_t select(const float* x, std::size_t n, std::uint32_t t, std::size_t eq_budget, std::uint32_t* idx,
                   float* val, std::size_t cap) {
  return select_t(LoadX{x}, n, t, eq_budget, idx, val, cap);
}

std::size_t select_ef(const float* g, float* e, std::size_t n, std::uint32_t t, std::size_t eq_budget,
                      std::uint32_t* idx, float* val, std::size_t cap) {
  return select_t(LoadEf{g, e}, n, t, eq_budget, idx, val, cap);
}
