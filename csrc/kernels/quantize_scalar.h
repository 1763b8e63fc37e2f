// The scalar reference of the quantization kernels (kernels/quantize.h): plain loops over the
// element formulas of kernels/quant_math.h. It is the test oracle every kernel table is compared
// with bit for bit, so it favours obviousness over speed. Part of the scalar table: included in
// the anonymous namespace of kernels_scalar.cc (built without vectorisation).
//
// Phases of every quantizing kernel, per block [i0, i1):
//   1. absmax pass: v = value(i); amax = max(amax, |v| bits); (sign) lanes[(i - i0) % 16] += |v|
//   2. scale: NaN when amax is not finite, else absmax / Q (8/4 bits) or mean |v| (sign)
//   3. code pass: v = value(i) again (the block is in L1); code, pack, decode d; done(i, v, d)
// value() is x (quantize), g + e (error feedback) or D(q_in) + x (ring hop); done() writes the
// residual e = v - d or the sum. Cost: one read of the inputs, one write of codes and outputs.
using namespace zcoll::kernels::qmath;
using zcoll::to_float;

template <class Value, class Done>
QuantStatus quantize_blocks(std::size_t n, const QuantParams& p, std::uint8_t* codes, float* scales,
                            Value value, Done done) {
  QuantStatus st;
  const RngKey key = rng_key(p.seed);
  const int q = qmax(p.bits);
  for (std::size_t b = 0, i0 = 0; i0 < n; ++b, i0 += p.block) {
    const std::size_t i1 = std::min(n, i0 + p.block);
    std::uint32_t amax = 0;
    float lanes[16] = {};
    for (std::size_t i = i0; i < i1; ++i) {
      const float v = value(b, i);
      amax = std::max(amax, abs_bits(v));
      if (p.bits == 1) lanes[(i - i0) % 16] += bits_float(abs_bits(v));
    }
    const bool bad = nonfinite(amax);
    float scale = block_scale(amax, q);
    if (bad && st.nonfinite_blocks++ == 0) st.first_nonfinite_block = b;
    if (!bad && p.bits == 1) {
      float sum = sum16(lanes);
      const bool rescale = sign_sum_overflowed(sum);
      if (rescale) {
        for (float& l : lanes) l = 0.0f;
        for (std::size_t i = i0; i < i1; ++i)
          lanes[(i - i0) % 16] += bits_float(abs_bits(value(b, i))) * kSignRescale;
        sum = sum16(lanes);
      }
      scale = sign_scale(sum, i1 - i0, amax, rescale);
    }
    scales[b] = scale;
    const float div = block_divisor(scale);
    for (std::size_t i = i0; i < i1; ++i) {
      const float v = value(b, i);
      int code = 0;
      if (!bad && p.bits == 1)
        code = v < 0.0f ? 1 : 0;
      else if (!bad && p.rounding == Rounding::kStochastic)
        code = code_stochastic(v, div, q, rng_u32(key, p.offset + i));
      else if (!bad)
        code = code_nearest(v, div, q);
      put_code(codes, p.bits, i, code);
      done(i, v, p.bits == 1 ? decode_sign(code != 0, scale) : decode(code, scale));
    }
  }
  return st;
}

template <typename T>
QuantStatus quantize_t(const T* x, std::size_t n, const QuantParams& p, std::uint8_t* codes, float* scales) {
  return quantize_blocks(
      n, p, codes, scales, [&](std::size_t, std::size_t i) { return to_float(x[i]); },
      [](std::size_t, float, float) {});
}

template <typename T>
QuantStatus ef_t(const T* g, float* e, std::size_t n, const QuantParams& p, std::uint8_t* codes,
                 float* scales) {
  return quantize_blocks(
      n, p, codes, scales, [&](std::size_t, std::size_t i) { return to_float(g[i]) + e[i]; },
      [&](std::size_t i, float r, float d) { e[i] = r - d; });
}

template <typename T>
QuantStatus hop_t(const std::uint8_t* cin, const float* sin, const T* x, std::size_t n, const QuantParams& p,
                  std::uint8_t* cout, float* sout, float* sum) {
  return quantize_blocks(
      n, p, cout, sout,
      [&](std::size_t b, std::size_t i) { return decoded_at(cin, p.bits, i, sin[b]) + to_float(x[i]); },
      [&](std::size_t i, float s, float) {
        if (sum != nullptr) sum[i] = s;
      });
}

QuantStatus quantize(const void* x, DType dtype, std::size_t n, const QuantParams& p, std::uint8_t* codes,
                     float* scales) {
  return dispatch_float_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return quantize_t(static_cast<const T*>(x), n, p, codes, scales);
  });
}

void dequantize(const std::uint8_t* codes, const float* scales, std::size_t n, const QuantParams& p, float* y,
                bool accumulate) {
  for (std::size_t i = 0; i < n; ++i) {
    const float d = decoded_at(codes, p.bits, i, scales[i / p.block]);
    y[i] = accumulate ? y[i] + d : d;
  }
}

QuantStatus dequantize_add_quantize(const std::uint8_t* codes_in, const float* scales_in, const void* x,
                                    DType dtype, std::size_t n, const QuantParams& p, std::uint8_t* codes_out,
                                    float* scales_out, float* sum_out) {
  return dispatch_float_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return hop_t(codes_in, scales_in, static_cast<const T*>(x), n, p, codes_out, scales_out, sum_out);
  });
}

QuantStatus quantize_ef(const void* g, DType dtype, float* e, std::size_t n, const QuantParams& p,
                        std::uint8_t* codes, float* scales) {
  return dispatch_float_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return ef_t(static_cast<const T*>(g), e, n, p, codes, scales);
  });
}
