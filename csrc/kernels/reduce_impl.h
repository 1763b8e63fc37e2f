// The reduction loops, written once and compiled once per instruction set: reduce_scalar.cc,
// reduce_avx2.cc and reduce_avx512.cc include this file inside their own namespace with their
// own compiler flags (Highway's "skeleton" pattern), so each copy is vectorised for its ISA and
// no inline function is shared between translation units built with different flags.
//
// Float32/64 and integer loops are auto-vectorised by the compiler (-O3). The half types need
// conversions: with ZCOLL_KERNEL_F16C the float16 loop uses F16C (8 lanes per instruction);
// bfloat16 conversion is integer shifts, which vectorise on their own.
#include <cstdint>
#include <type_traits>

#include "common/dtype.h"
#include "common/half.h"
#if ZCOLL_KERNEL_F16C
#include <immintrin.h>
#endif

namespace {

using zcoll::bfloat16_t;
using zcoll::DType;
using zcoll::float16_t;
using zcoll::ReduceOp;

struct Sum {
  template <typename T>
  static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
    } else {
      return a + b;
    }
  }
};
struct Prod {
  template <typename T>
  static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      using U = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;
      return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
    } else {
      return a * b;
    }
  }
};
struct Min {
  template <typename T>
  static T apply(T a, T b) {
    return (a < b || a != a) ? a : b;  // a != a: NaN propagates
  }
};
struct Max {
  template <typename T>
  static T apply(T a, T b) {
    return (a > b || a != a) ? a : b;
  }
};

template <typename Op, typename T>
void reduce_loop(T* out, const T* a, const T* b, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) out[i] = Op::apply(a[i], b[i]);
}

// bfloat16 <-> float32 as branch-free integer arithmetic so the loop vectorises.
inline float bf16_load(std::uint16_t h) { return zcoll::bits_float(std::uint32_t(h) << 16); }
inline std::uint16_t bf16_store(float f) {
  std::uint32_t u = zcoll::float_bits(f);
  const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const std::uint32_t quiet_nan = (u >> 16) | 0x40u;
  return static_cast<std::uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

template <typename Op>
void reduce_loop(bfloat16_t* out, const bfloat16_t* a, const bfloat16_t* b, std::size_t n) {
  auto* o = reinterpret_cast<std::uint16_t*>(out);
  const auto* x = reinterpret_cast<const std::uint16_t*>(a);
  const auto* y = reinterpret_cast<const std::uint16_t*>(b);
  for (std::size_t i = 0; i < n; ++i) o[i] = bf16_store(Op::apply(bf16_load(x[i]), bf16_load(y[i])));
}

#if ZCOLL_KERNEL_F16C
template <typename Op>
__m256 apply8(__m256 a, __m256 b) {
  if constexpr (std::is_same_v<Op, Sum>) return _mm256_add_ps(a, b);
  if constexpr (std::is_same_v<Op, Prod>) return _mm256_mul_ps(a, b);
  // min/max with NaN propagation from a first, then b (same rule as Min/Max::apply).
  const __m256 a_nan = _mm256_cmp_ps(a, a, _CMP_UNORD_Q);
  __m256 pick_a;
  if constexpr (std::is_same_v<Op, Min>)
    pick_a = _mm256_or_ps(_mm256_cmp_ps(a, b, _CMP_LT_OQ), a_nan);
  else
    pick_a = _mm256_or_ps(_mm256_cmp_ps(a, b, _CMP_GT_OQ), a_nan);
  return _mm256_blendv_ps(b, a, pick_a);
}
#endif

template <typename Op>
void reduce_loop(float16_t* out, const float16_t* a, const float16_t* b, std::size_t n) {
  auto* o = reinterpret_cast<std::uint16_t*>(out);
  const auto* x = reinterpret_cast<const std::uint16_t*>(a);
  const auto* y = reinterpret_cast<const std::uint16_t*>(b);
  std::size_t i = 0;
#if ZCOLL_KERNEL_F16C
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  for (; i + 8 <= n; i += 8) {
    const __m256 va = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i)));
    const __m256 vb = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(y + i)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o + i), _mm256_cvtps_ph(apply8<Op>(va, vb), kRound));
  }
#endif
  for (; i < n; ++i)
    o[i] = zcoll::float_to_fp16(Op::apply(zcoll::fp16_to_float(x[i]), zcoll::fp16_to_float(y[i])));
}

template <typename T>
void divide_loop(T* buf, std::size_t n, int divisor) {
  if constexpr (std::is_same_v<T, double>) {
    const double d = divisor;
    for (std::size_t i = 0; i < n; ++i) buf[i] = buf[i] / d;
  } else if constexpr (std::is_same_v<T, float>) {
    const float d = static_cast<float>(divisor);
    for (std::size_t i = 0; i < n; ++i) buf[i] = buf[i] / d;
  } else if constexpr (std::is_same_v<T, bfloat16_t>) {
    auto* h = reinterpret_cast<std::uint16_t*>(buf);
    const float d = static_cast<float>(divisor);
    for (std::size_t i = 0; i < n; ++i) h[i] = bf16_store(bf16_load(h[i]) / d);
  } else if constexpr (std::is_same_v<T, float16_t>) {
    auto* h = reinterpret_cast<std::uint16_t*>(buf);
    const float d = static_cast<float>(divisor);
    for (std::size_t i = 0; i < n; ++i) h[i] = zcoll::float_to_fp16(zcoll::fp16_to_float(h[i]) / d);
  }
}

template <typename T>
void reduce_typed(void* out, const void* a, const void* b, std::size_t n, ReduceOp op) {
  auto* o = static_cast<T*>(out);
  const auto* x = static_cast<const T*>(a);
  const auto* y = static_cast<const T*>(b);
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return reduce_loop<Sum>(o, x, y, n);
    case ReduceOp::kProd: return reduce_loop<Prod>(o, x, y, n);
    case ReduceOp::kMin: return reduce_loop<Min>(o, x, y, n);
    case ReduceOp::kMax: return reduce_loop<Max>(o, x, y, n);
  }
}

}  // namespace

void reduce(void* out, const void* a, const void* b, std::size_t count, DType dtype, ReduceOp op) {
  zcoll::dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    reduce_typed<T>(out, a, b, count, op);
  });
}

void divide(void* buf, std::size_t count, DType dtype, int divisor) {
  zcoll::dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (!std::is_integral_v<T>) divide_loop<T>(static_cast<T*>(buf), count, divisor);
  });
}
