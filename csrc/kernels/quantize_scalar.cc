// The scalar reference of the quantization kernels (kernels/quantize.h): plain loops over the
// element formulas of kernels/quant_math.h, compiled without vectorisation. It is the test oracle
// the SIMD copies are compared with bit for bit, so it favours obviousness over speed.
//
// Phases of every quantizing kernel, per block [i0, i1):
//   1. absmax pass: v = value(i); amax = max(amax, |v| bits); (sign) lanes[(i - i0) % 16] += |v|
//   2. scale: NaN when amax is not finite, else absmax / Q (8/4 bits) or mean |v| (sign)
//   3. code pass: v = value(i) again (the block is in L1); code, pack, decode d; done(i, v, d)
// value() is x (quantize), g + e (error feedback) or D(q_in) + x (ring hop); done() writes the
// residual e = v - d or the sum. Cost: one read of the inputs, one write of codes and outputs.
#include <algorithm>

#include "common/half.h"
#include "kernels/quant_math.h"
#include "kernels/quantize_isa.h"

namespace zcoll::kernels::scalar {
namespace {
using namespace qmath;

float widen(float v) { return v; }
float widen(float16_t h) { return fp16_to_float(h.bits); }
float widen(bfloat16_t h) { return bf16_to_float(h.bits); }

// Stores element i's code (bits 8/4: the integer code; bits 1: 1 when negative).
void put_code(std::uint8_t* codes, int bits, std::size_t i, int code) {
  if (bits == 8) {
    codes[i] = static_cast<std::uint8_t>(static_cast<std::int8_t>(code));
  } else if (bits == 4) {
    if (i % 2 == 0)
      codes[i / 2] = nibble(code);
    else
      codes[i / 2] = static_cast<std::uint8_t>(codes[i / 2] | (nibble(code) << 4));
  } else {
    if (i % 8 == 0) codes[i / 8] = 0;
    codes[i / 8] = static_cast<std::uint8_t>(codes[i / 8] | (code << (i % 8)));
  }
}

float decoded(const std::uint8_t* codes, int bits, std::size_t i, float scale) {
  if (bits == 8) return decode(static_cast<std::int8_t>(codes[i]), scale);
  if (bits == 4) return decode(unnibble(codes[i / 2], i % 2 == 1), scale);
  return decode_sign(((codes[i / 8] >> (i % 8)) & 1) != 0, scale);
}

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
      if (p.bits == 1) lanes[(i - i0) % 16] += bitsf(abs_bits(v));
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
          lanes[(i - i0) % 16] += bitsf(abs_bits(value(b, i))) * kSignRescale;
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
      n, p, codes, scales, [&](std::size_t, std::size_t i) { return widen(x[i]); },
      [](std::size_t, float, float) {});
}

template <typename T>
QuantStatus ef_t(const T* g, float* e, std::size_t n, const QuantParams& p, std::uint8_t* codes,
                 float* scales) {
  return quantize_blocks(
      n, p, codes, scales, [&](std::size_t, std::size_t i) { return widen(g[i]) + e[i]; },
      [&](std::size_t i, float r, float d) { e[i] = r - d; });
}

template <typename T>
QuantStatus hop_t(const std::uint8_t* cin, const float* sin, const T* x, std::size_t n, const QuantParams& p,
                  std::uint8_t* cout, float* sout, float* sum) {
  return quantize_blocks(
      n, p, cout, sout,
      [&](std::size_t b, std::size_t i) { return decoded(cin, p.bits, i, sin[b]) + widen(x[i]); },
      [&](std::size_t i, float s, float) {
        if (sum != nullptr) sum[i] = s;
      });
}

template <typename Fn>
decltype(auto) dispatch_float(DType dtype, Fn&& fn) {
  if (dtype == DType::kFloat16) return fn(TypeTag<float16_t>{});
  if (dtype == DType::kBFloat16) return fn(TypeTag<bfloat16_t>{});
  return fn(TypeTag<float>{});
}

}  // namespace

QuantStatus quantize(const void* x, DType dtype, std::size_t n, const QuantParams& p, std::uint8_t* codes,
                     float* scales) {
  return dispatch_float(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return quantize_t(static_cast<const T*>(x), n, p, codes, scales);
  });
}

void dequantize(const std::uint8_t* codes, const float* scales, std::size_t n, const QuantParams& p, float* y,
                bool accumulate) {
  for (std::size_t i = 0; i < n; ++i) {
    const float d = decoded(codes, p.bits, i, scales[i / p.block]);
    y[i] = accumulate ? y[i] + d : d;
  }
}

QuantStatus dequantize_add_quantize(const std::uint8_t* codes_in, const float* scales_in, const void* x,
                                    DType dtype, std::size_t n, const QuantParams& p, std::uint8_t* codes_out,
                                    float* scales_out, float* sum_out) {
  return dispatch_float(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return hop_t(codes_in, scales_in, static_cast<const T*>(x), n, p, codes_out, scales_out, sum_out);
  });
}

QuantStatus quantize_ef(const void* g, DType dtype, float* e, std::size_t n, const QuantParams& p,
                        std::uint8_t* codes, float* scales) {
  return dispatch_float(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return ef_t(static_cast<const T*>(g), e, n, p, codes, scales);
  });
}

void cast(const void* x, DType from, void* y, DType to, std::size_t n) {
  const auto* f = static_cast<const float*>(x);
  const auto* h = static_cast<const std::uint16_t*>(x);
  auto* fo = static_cast<float*>(y);
  auto* ho = static_cast<std::uint16_t*>(y);
  for (std::size_t i = 0; i < n; ++i) {
    if (from == DType::kFloat32 && to == DType::kFloat16)
      ho[i] = float_to_fp16(f[i]);
    else if (from == DType::kFloat32 && to == DType::kBFloat16)
      ho[i] = float_to_bf16(f[i]);
    else if (from == DType::kFloat16)
      fo[i] = fp16_to_float(h[i]);
    else
      fo[i] = bf16_to_float(h[i]);
  }
}

}  // namespace zcoll::kernels::scalar
