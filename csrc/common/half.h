// 16-bit float storage types and the one definition of their conversions to and from float32:
// widening is exact; narrowing rounds to nearest even, keeps NaN a (quiet) NaN and overflows to
// Inf as IEEE does. Arithmetic on half values is done in float32 and rounded back once: for
// + - * / that double rounding is innocuous (float32 has >= 2p+2 bits for p = 11 and p = 8), so
// every result is the correctly rounded half/bfloat16 result, the one numpy's float16 gives.
//
// These scalar routines are the specification. Every scalar path calls them (the scalar kernel
// table, the tails of the SIMD loops, the bindings and benchmarks); the vector copies are written
// once per instruction set (bfloat16: kernels/simd_ops.h, the same formula; float16: the F16C
// conversion instructions in kernels/simd_ops_<isa>.h) and tested bit for bit against these.
// CUDA calls them too (static ZCOLL_HD: host and device, one copy per translation unit).
#pragma once
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "common/host_device.h"

namespace zcoll {

struct float16_t {
  std::uint16_t bits;
};
struct bfloat16_t {
  std::uint16_t bits;
};

static ZCOLL_HD std::uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

static ZCOLL_HD float bits_float(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// bfloat16 is the upper half of a float32.
static ZCOLL_HD float bf16_to_float(std::uint16_t h) { return bits_float(std::uint32_t(h) << 16); }

// Round to nearest even: add 0x7fff plus the lowest kept bit, drop the low 16 bits (a carry out
// of the mantissa bumps the exponent, up to Inf). NaN: keep the top bits, set the quiet bit.
static ZCOLL_HD std::uint16_t float_to_bf16(float f) {
  const std::uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return std::uint16_t((u >> 16) | 0x40u);  // quiet NaN
  return std::uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static ZCOLL_HD float fp16_to_float(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  std::uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (mant << 13));  // inf / nan
  if (exp != 0) return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return bits_float(sign);
  // Subnormal half: value = mant * 2^-24, exact in float32.
  float v = float(mant) * 5.9604644775390625e-8f;
  return sign ? -v : v;
}

static ZCOLL_HD std::uint16_t float_to_fp16(float f) {
  const std::uint32_t u = float_bits(f);
  const std::uint16_t sign = std::uint16_t((u >> 16) & 0x8000u);
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return std::uint16_t(sign | 0x7e00u | ((a >> 13) & 0x3ffu));  // NaN
  if (a >= 0x477ff000u) return std::uint16_t(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (a < 0x38800000u) {
    // Result is subnormal (or zero): value / 2^-24, rounded to nearest even, as an integer.
    // Adding 0.5f (2^-1) shifts the significand so the FPU rounds it for us (exact trick).
    const float shifted = bits_float(a) + 0.5f;
    return std::uint16_t(sign | (float_bits(shifted) - 0x3f000000u));
  }
  std::uint32_t mant_odd = (a >> 13) & 1u;
  std::uint32_t r = a + 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round
  return std::uint16_t(sign | (r >> 13));
}

// The same conversions on the storage types, for code generic over float / float16_t /
// bfloat16_t: to_float widens (the identity on float), from_float<T> rounds.
static ZCOLL_HD float to_float(float v) { return v; }
static ZCOLL_HD float to_float(float16_t h) { return fp16_to_float(h.bits); }
static ZCOLL_HD float to_float(bfloat16_t h) { return bf16_to_float(h.bits); }

template <typename T>
static ZCOLL_HD T from_float(float f) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, float16_t> || std::is_same_v<T, bfloat16_t>,
                "from_float: float, float16_t or bfloat16_t");
  if constexpr (std::is_same_v<T, float16_t>) {
    return float16_t{float_to_fp16(f)};
  } else if constexpr (std::is_same_v<T, bfloat16_t>) {
    return bfloat16_t{float_to_bf16(f)};
  } else {
    return f;
  }
}

}  // namespace zcoll
