// The per-element arithmetic of the block quantizers: the specification every implementation
// (scalar reference, AVX2, AVX-512, CUDA) reproduces bit for bit, and the per-element payload
// layout (put_code / decoded_at) that the scalar reference and the tails of the SIMD loops share.
// Plain C++, __host__ __device__ under nvcc; internal linkage so no copy compiled with one ISA's
// flags is shared with another.
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

#include "common/half.h"
#include "common/rng.h"

namespace zcoll::kernels::qmath {

constexpr std::uint32_t kAbsMask = 0x7fffffffu;
constexpr std::uint32_t kInfBits = 0x7f800000u;
constexpr std::uint32_t kQuietNaNBits = 0x7fc00000u;

static ZCOLL_HD int qmax(int bits) { return bits == 8 ? 127 : 7; }
static ZCOLL_HD std::uint32_t abs_bits(float x) { return float_bits(x) & kAbsMask; }
static ZCOLL_HD bool nonfinite(std::uint32_t absmax_bits) { return absmax_bits >= kInfBits; }

static ZCOLL_HD float block_scale(std::uint32_t absmax_bits, int q) {
  if (nonfinite(absmax_bits)) return bits_float(kQuietNaNBits);
  return bits_float(absmax_bits) / static_cast<float>(q);
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

// Stores element i's code in the payload layout of kernels/quantize.h (bits 8/4: the integer
// code; bits 1: 1 when negative). Elements are stored in increasing order: the first element of
// a byte clears the bits the others then set.
static ZCOLL_HD void put_code(std::uint8_t* codes, int bits, std::size_t i, int code) {
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

// D(q)[i]: element i of a payload decoded with its block's scale.
static ZCOLL_HD float decoded_at(const std::uint8_t* codes, int bits, std::size_t i, float scale) {
  if (bits == 8) return decode(static_cast<std::int8_t>(codes[i]), scale);
  if (bits == 4) return decode(unnibble(codes[i / 2], i % 2 == 1), scale);
  return decode_sign(((codes[i / 8] >> (i % 8)) & 1) != 0, scale);
}

// The sign quantizer's scale from the canonical sum of |v| (see sum16) over `count` elements.
// If that sum overflows (|v| near FLT_MAX), the sum is redone on |v| * 2^-64 (`rescaled`) and
// the mean scaled back. Clamped to absmax, which it can only exceed by rounding.
constexpr float kSignRescale = 5.42101086242752217e-20f;  // 2^-64
static ZCOLL_HD float sign_scale(float sum, std::size_t count, std::uint32_t absmax_bits, bool rescaled) {
  float mean = sum / static_cast<float>(count);
  if (rescaled) mean = mean * 18446744073709551616.0f;  // 2^64
  const float amax = bits_float(absmax_bits);
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
