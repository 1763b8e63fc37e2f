// The per-element arithmetic of the block quantizers: the specification every implementation
// (scalar reference, AVX2, AVX-512, CUDA) reproduces bit for bit. Plain C++, __host__ __device__
// under nvcc; internal linkage so no copy compiled with one ISA's flags is shared with another.
//
// For a block with absmax bits A (the largest |x| as an IEEE bit pattern, compared as integers so
// NaN > Inf > every finite value) and qmax Q (127 for int8, 7 for int4):
//   scale   = A >= Inf ? NaN : float(A) / Q          (the float32 stored per block)
//   div     = scale > 0 ? scale : 1                  (all-zero / underflowed blocks give code 0)
//   v       = clamp(x / div, -Q, Q)
//   nearest:    code = rint(v)                       (round half to even)
//   stochastic: code = floor(v) + (u < v - floor(v)), u = rng_uniform(rng_u32(key, offset + i))
//   decode  = float(code) * scale                    (a separate multiply: never fused)
// Sign (1 bit): scale = min(absmax, (sum of |x| in the canonical 16-lane order, see sum16)
//   / count) (sign_scale), bit = x < 0, decode = bit ? -scale : scale.
// A block holding NaN or +-Inf gets scale NaN and codes 0 (its decode is NaN).
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/rng.h"

namespace zcoll::kernels::qmath {

constexpr std::uint32_t kAbsMask = 0x7fffffffu;
constexpr std::uint32_t kInfBits = 0x7f800000u;
constexpr std::uint32_t kQuietNaNBits = 0x7fc00000u;

static ZCOLL_HD std::uint32_t fbits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

static ZCOLL_HD float bitsf(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

static ZCOLL_HD int qmax(int bits) { return bits == 8 ? 127 : 7; }
static ZCOLL_HD std::uint32_t abs_bits(float x) { return fbits(x) & kAbsMask; }
static ZCOLL_HD bool nonfinite(std::uint32_t absmax_bits) { return absmax_bits >= kInfBits; }

static ZCOLL_HD float block_scale(std::uint32_t absmax_bits, int q) {
  if (nonfinite(absmax_bits)) return bitsf(kQuietNaNBits);
  return bitsf(absmax_bits) / static_cast<float>(q);
}
static ZCOLL_HD float block_divisor(float scale) { return scale > 0.0f ? scale : 1.0f; }

static ZCOLL_HD float clamp_q(float v, float q) {
  v = v < -q ? -q : v;
  return v > q ? q : v;
}

static ZCOLL_HD int round_even(float v) {
#if defined(__CUDA_ARCH__)
  return __float2int_rn(v);
#else
  return static_cast<int>(__builtin_lrintf(v));  // cvtss2si: the MXCSR default, nearest-even
#endif
}

static ZCOLL_HD int code_nearest(float x, float div, int q) {
  return round_even(clamp_q(x / div, static_cast<float>(q)));
}

static ZCOLL_HD int code_stochastic(float x, float div, int q, std::uint32_t h) {
  const float v = clamp_q(x / div, static_cast<float>(q));
  const float f = floorf(v);
  const float frac = v - f;
  return static_cast<int>(f) + (rng_uniform(h) < frac ? 1 : 0);
}

static ZCOLL_HD float decode(int code, float scale) { return static_cast<float>(code) * scale; }
static ZCOLL_HD float decode_sign(bool negative, float scale) { return negative ? -scale : scale; }

// int4 packing: element i lives in byte i/2, low nibble if i is even; 4-bit two's complement.
static ZCOLL_HD std::uint8_t nibble(int code) { return static_cast<std::uint8_t>(code & 0xf); }
static ZCOLL_HD int unnibble(std::uint8_t byte, bool high) {
  const int v = high ? (byte >> 4) : (byte & 0xf);
  return (v ^ 8) - 8;
}

// The sign quantizer's scale from the canonical sum of |v| (see sum16) over `count` elements.
// If that sum overflows (|v| near FLT_MAX), the sum is redone on |v| * 2^-64 (`rescaled`) and
// the mean scaled back. Clamped to absmax, which it can only exceed by rounding.
constexpr float kSignRescale = 5.42101086242752217e-20f;  // 2^-64
static ZCOLL_HD float sign_scale(float sum, std::size_t count, std::uint32_t absmax_bits, bool rescaled) {
  float mean = sum / static_cast<float>(count);
  if (rescaled) mean = mean * 18446744073709551616.0f;  // 2^64
  const float amax = bitsf(absmax_bits);
  return mean < amax ? mean : amax;
}
static ZCOLL_HD bool sign_sum_overflowed(float sum) { return abs_bits(sum) >= kInfBits; }

// The canonical summation order of the sign quantizer's mean |x|: element j of the block goes to
// lane j % 16 (lanes summed in element order, starting from +0), then the lanes are combined as
// a tree: l[j] += l[j + 8] (j < 8), l[j] += l[j + 4] (j < 4), l[j] += l[j + 2], l[0] + l[1].
static ZCOLL_HD float sum16(float* l) {
  for (int w = 8; w >= 1; w /= 2)
    for (int j = 0; j < w; ++j) l[j] = l[j] + l[j + w];
  return l[0];
}

}  // namespace zcoll::kernels::qmath
