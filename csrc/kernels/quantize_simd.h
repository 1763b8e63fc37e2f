// The quantization kernels written once over the vector operations V (simd_ops.h) and compiled
// into every SIMD table (kernels_avx2.cc, kernels_avx512.cc), Highway's "skeleton" pattern.
// Same phases, formulas and results as the scalar reference (quantize_scalar.h):
//   1. absmax pass over the block: integer max of |v| bit patterns (+ 16-lane |v| sums for sign)
//   2. scale (quant_math.h)
//   3. code pass: the block again from L1: divide, clamp, round, pack, decode, done()
// Vectors cover the block from its first element; the rest of a block (block % kLanes) goes
// through the scalar formulas (quant_math.h). Cost per element: 2 loads from L1 (1 from DRAM),
// ~10 vector ops. Included in the anonymous namespace of kernels_<isa>.cc, after simd_ops.h.
using namespace zcoll::kernels::qmath;

// Sources of the value to quantize: vec(i) = lanes i .. i+kL-1, at(i) = element i; done() gets
// each value with its decoded value.
template <typename T>
struct Plain {
  const T* x;
  void begin_block(std::size_t) {}
  V::F vec(std::size_t i) const { return V::load(x + i); }
  float at(std::size_t i) const { return zcoll::to_float(x[i]); }
  void done(std::size_t, V::F, V::F) {}
  void done(std::size_t, float, float) {}
};

template <typename T>
struct ErrorFeedback {  // r = g + e; e = r - D(Q(r))
  const T* g;
  float* e;
  void begin_block(std::size_t) {}
  V::F vec(std::size_t i) const { return V::add(V::load(g + i), V::load(e + i)); }
  float at(std::size_t i) const { return zcoll::to_float(g[i]) + e[i]; }
  void done(std::size_t i, V::F r, V::F d) { V::store(e + i, V::sub(r, d)); }
  void done(std::size_t i, float r, float d) { e[i] = r - d; }
};

V::F decoded_vec(const std::uint8_t* codes, int bits, std::size_t i, V::F scale) {
  if (bits == 8) return V::mul(V::to_float(V::load_i8(codes + i)), scale);
  if (bits == 4) return V::mul(V::to_float(V::load_i4(codes + i / 2)), scale);
  return V::sign_decode(V::load_bits(codes + i / 8), scale);
}

template <typename T>
struct Hop {  // s = D(q_in) + x; optionally sum_out = s
  const std::uint8_t* cin;
  const float* sin;
  const T* x;
  float* sum;
  int bits;
  float scale = 0.0f;
  void begin_block(std::size_t b) { scale = sin[b]; }
  V::F vec(std::size_t i) const { return V::add(decoded_vec(cin, bits, i, V::set1(scale)), V::load(x + i)); }
  float at(std::size_t i) const { return decoded_at(cin, bits, i, scale) + zcoll::to_float(x[i]); }
  void done(std::size_t i, V::F s, V::F) {
    if (sum != nullptr) V::store(sum + i, s);
  }
  void done(std::size_t i, float s, float) {
    if (sum != nullptr) sum[i] = s;
  }
};

// Phase 1: absmax bits of block [i0, i1), and for sign the canonical sum of |v| (times 2^-64
// when kRescale: the rare second pass after that sum overflowed).
template <bool kSign, bool kRescale = false, class Src>
std::uint32_t block_absmax(const Src& src, std::size_t i0, std::size_t i1, float* sum) {
  constexpr std::size_t kAcc = 16 / kL;  // accumulators that together form the 16 canonical lanes
  V::I m = V::zero_i();
  V::F acc[kAcc];
  for (auto& a : acc) a = V::zero();
  const V::F vr = V::set1(kSignRescale);
  std::size_t i = i0, k = 0;
  for (; i + kL <= i1; i += kL, ++k) {
    const V::F v = src.vec(i);
    m = V::max_u32(m, V::abs_bits(v));
    if constexpr (kSign) acc[k % kAcc] = V::add(acc[k % kAcc], kRescale ? V::mul(V::abs(v), vr) : V::abs(v));
  }
  std::uint32_t amax = V::hmax_u32(m);
  float lanes[16];
  if constexpr (kSign)
    for (std::size_t a = 0; a < kAcc; ++a) V::store(lanes + a * kL, acc[a]);
  for (; i < i1; ++i) {
    const float v = src.at(i);
    amax = amax > abs_bits(v) ? amax : abs_bits(v);
    if constexpr (kSign)
      lanes[(i - i0) % 16] += kRescale ? bits_float(abs_bits(v)) * kSignRescale : bits_float(abs_bits(v));
  }
  if constexpr (kSign) *sum = sum16(lanes);
  return amax;
}

// Phase 3 for 8/4 bits.
template <int kBits, bool kStochastic, class Src>
void code_block(Src& src, std::size_t i0, std::size_t i1, float scale, const QuantParams& p, RngKey key,
                std::uint8_t* codes) {
  constexpr int q = kBits == 8 ? 127 : 7;
  const float div = block_divisor(scale);
  const V::F vdiv = V::set1(div), vq = V::set1(float(q)), vs = V::set1(scale);
  std::size_t i = i0;
  for (; i + kL <= i1; i += kL) {
    const V::F v = src.vec(i);
    const V::F t = V::clamp(V::div(v, vdiv), vq);
    V::I c;
    if constexpr (kStochastic) {
      const V::F f = V::floor(t);
      const V::F u = V::uniform(V::rng_u32(key, p.offset + i));
      c = V::rint(V::add(f, V::one_if_less(u, V::sub(t, f))));
    } else {
      c = V::rint(t);
    }
    if constexpr (kBits == 8)
      V::store_i8(codes + i, c);
    else
      V::store_i4(codes + i / 2, c);
    src.done(i, v, V::mul(V::to_float(c), vs));
  }
  for (; i < i1; ++i) {
    const float v = src.at(i);
    const int c =
        kStochastic ? code_stochastic(v, div, q, zcoll::rng_u32(key, p.offset + i)) : code_nearest(v, div, q);
    put_code(codes, kBits, i, c);
    src.done(i, v, decode(c, scale));
  }
}

// Phase 3 for sign bits.
template <class Src>
void sign_block(Src& src, std::size_t i0, std::size_t i1, float scale, std::uint8_t* codes) {
  const V::F vs = V::set1(scale);
  std::size_t i = i0;
  for (; i + kL <= i1; i += kL) {
    const V::F v = src.vec(i);
    const V::Bits m = V::neg_bits(v);
    V::store_bits(codes + i / 8, m);
    src.done(i, v, V::sign_decode(m, vs));
  }
  for (; i < i1; ++i) {
    const float v = src.at(i);
    put_code(codes, 1, i, v < 0.0f ? 1 : 0);
    src.done(i, v, decode_sign(v < 0.0f, scale));
  }
}

// A block holding NaN/Inf: codes 0, decode NaN (the scalar reference's formulas).
template <class Src>
void bad_block(Src& src, std::size_t i0, std::size_t i1, float scale, int bits, std::uint8_t* codes) {
  for (std::size_t i = i0; i < i1; ++i) {
    put_code(codes, bits, i, 0);
    src.done(i, src.at(i), bits == 1 ? decode_sign(false, scale) : decode(0, scale));
  }
}

template <int kBits, bool kStochastic, class Src>
QuantStatus quantize_blocks(Src& src, std::size_t n, const QuantParams& p, std::uint8_t* codes,
                            float* scales) {
  QuantStatus st;
  const RngKey key = zcoll::rng_key(p.seed);
  for (std::size_t b = 0, i0 = 0; i0 < n; ++b, i0 += p.block) {
    const std::size_t i1 = n - i0 < p.block ? n : i0 + p.block;
    src.begin_block(b);
    float sum = 0.0f;
    const std::uint32_t amax = block_absmax<kBits == 1>(src, i0, i1, &sum);
    float scale = block_scale(amax, kBits == 1 ? 1 : qmax(kBits));
    if (!nonfinite(amax) && kBits == 1) {
      const bool rescale = sign_sum_overflowed(sum);
      if (rescale) block_absmax<true, true>(src, i0, i1, &sum);
      scale = sign_scale(sum, i1 - i0, amax, rescale);
    }
    scales[b] = scale;
    if (nonfinite(amax)) {
      if (st.nonfinite_blocks++ == 0) st.first_nonfinite_block = b;
      bad_block(src, i0, i1, scale, kBits, codes);
    } else if constexpr (kBits == 1) {
      sign_block(src, i0, i1, scale, codes);
    } else {
      code_block<kBits, kStochastic>(src, i0, i1, scale, p, key, codes);
    }
  }
  return st;
}

template <class Src>
QuantStatus run(Src src, std::size_t n, const QuantParams& p, std::uint8_t* codes, float* scales) {
  const bool sr = p.rounding == Rounding::kStochastic;
  if (p.bits == 1) return quantize_blocks<1, false>(src, n, p, codes, scales);
  if (p.bits == 4)
    return sr ? quantize_blocks<4, true>(src, n, p, codes, scales)
              : quantize_blocks<4, false>(src, n, p, codes, scales);
  return sr ? quantize_blocks<8, true>(src, n, p, codes, scales)
            : quantize_blocks<8, false>(src, n, p, codes, scales);
}

template <int kBits, bool kAccumulate>
void dequantize_t(const std::uint8_t* codes, const float* scales, std::size_t n, std::size_t block,
                  float* y) {
  for (std::size_t b = 0, i0 = 0; i0 < n; ++b, i0 += block) {
    const std::size_t i1 = n - i0 < block ? n : i0 + block;
    const float s = scales[b];
    const V::F vs = V::set1(s);
    std::size_t i = i0;
    for (; i + kL <= i1; i += kL) {
      const V::F d = decoded_vec(codes, kBits, i, vs);
      V::store(y + i, kAccumulate ? V::add(V::load(y + i), d) : d);
    }
    for (; i < i1; ++i) {
      const float d = decoded_at(codes, kBits, i, s);
      y[i] = kAccumulate ? y[i] + d : d;
    }
  }
}

template <bool kAccumulate>
void dequantize_acc(const std::uint8_t* codes, const float* scales, std::size_t n, std::size_t block,
                    int bits, float* y) {
  if (bits == 8) return dequantize_t<8, kAccumulate>(codes, scales, n, block, y);
  if (bits == 4) return dequantize_t<4, kAccumulate>(codes, scales, n, block, y);
  return dequantize_t<1, kAccumulate>(codes, scales, n, block, y);
}

QuantStatus quantize(const void* x, DType dtype, std::size_t n, const QuantParams& p, std::uint8_t* codes,
                     float* scales) {
  return dispatch_float_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return run(Plain<T>{static_cast<const T*>(x)}, n, p, codes, scales);
  });
}

void dequantize(const std::uint8_t* codes, const float* scales, std::size_t n, const QuantParams& p, float* y,
                bool accumulate) {
  if (accumulate) return dequantize_acc<true>(codes, scales, n, p.block, p.bits, y);
  dequantize_acc<false>(codes, scales, n, p.block, p.bits, y);
}

QuantStatus dequantize_add_quantize(const std::uint8_t* codes_in, const float* scales_in, const void* x,
                                    DType dtype, std::size_t n, const QuantParams& p, std::uint8_t* codes_out,
                                    float* scales_out, float* sum_out) {
  return dispatch_float_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return run(Hop<T>{codes_in, scales_in, static_cast<const T*>(x), sum_out, p.bits}, n, p, codes_out,
               scales_out);
  });
}

QuantStatus quantize_ef(const void* g, DType dtype, float* e, std::size_t n, const QuantParams& p,
                        std::uint8_t* codes, float* scales) {
  return dispatch_float_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return run(ErrorFeedback<T>{static_cast<const T*>(g), e}, n, p, codes, scales);
  });
}
