// The scalar reference of the sparsification passes (kernels/kernel_table.h: select, select_ef):
// plain loops over the element rule of sparsify_math.h, the test oracle of the SIMD copies.
// Part of the scalar table: included in the anonymous namespace of kernels_scalar.cc.

std::size_t select(const float* x, std::size_t n, std::uint32_t t, std::size_t eq_budget, std::uint32_t* idx,
                   float* val, std::size_t cap) {
  smath::Selector s{t, eq_budget, idx, val, cap};
  for (std::size_t i = 0; i < n; ++i) s.offer(i, x[i]);
  return s.count;
}

std::size_t select_ef(const float* g, float* e, std::size_t n, std::uint32_t t, std::size_t eq_budget,
                      std::uint32_t* idx, float* val, std::size_t cap) {
  smath::Selector s{t, eq_budget, idx, val, cap};
  for (std::size_t i = 0; i < n; ++i) {
    const float r = g[i] + e[i];
    e[i] = r;
    s.offer(i, r);
  }
  return s.count;
}
