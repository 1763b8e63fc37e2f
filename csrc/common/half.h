// 16-bit float storage types and exact conversions (round to nearest even, NaN kept quiet).
// Arithmetic on them is done in float32 and rounded back once: for + - * / that double rounding
// is innocuous (float32 has >= 2p+2 bits for p = 11 and p = 8), so every result is the correctly
// rounded half/bfloat16 result, the same one numpy's float16 arithmetic gives.
#pragma once
#include <cstdint>
#include <cstring>

namespace zcoll {

struct float16_t {
  std::uint16_t bits;
};
struct bfloat16_t {
  std::uint16_t bits;
};

inline std::uint32_t float_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float bf16_to_float(std::uint16_t h) { return bits_float(std::uint32_t(h) << 16); }

inline std::uint16_t float_to_bf16(float f) {
  std::uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return std::uint16_t((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return std::uint16_t(u >> 16);
}

inline float fp16_to_float(std::uint16_t h) {
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

inline std::uint16_t float_to_fp16(float f) {
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

inline float to_float(float16_t h) { return fp16_to_float(h.bits); }
inline float to_float(bfloat16_t h) { return bf16_to_float(h.bits); }
template <typename H>
H from_float(float f);
template <>
inline float16_t from_float<float16_t>(float f) { return float16_t{float_to_fp16(f)}; }
template <>
inline bfloat16_t from_float<bfloat16_t>(float f) { return bfloat16_t{float_to_bf16(f)}; }

}  // namespace zcoll
