// The elementwise kernels reduce, divide (kernels/reduce.h) and cast (kernels/quantize.h),
// written once and compiled into every kernel table (kernels_scalar.cc, kernels_avx2.cc,
// kernels_avx512.cc) with that file's flags: Highway's "skeleton" pattern.
//
//   float32 / float64 / integers: plain loops; the compiler vectorises them for the ISA (-O3)
//     except in the scalar table (-fno-tree-vectorize). band / bor / bxor: integers only.
//   bool and complex never get here: kernels/reduce.cc maps them onto these (reduce_lanes).
//   float16 / bfloat16: widen exactly, compute in float32, round once (common/half.h). With
//     ZCOLL_KERNEL_SIMD the vector operations V (simd_ops.h) do kLanes elements at a time and
//     the common/half.h routines the rest; without it those routines do every element.
//
// Included in the anonymous namespace of kernels_<isa>.cc (ZCOLL_KERNEL_SIMD 1: after
// simd_ops.h; 0 in kernels_scalar.cc).

using zcoll::bfloat16_t;
using zcoll::DType;
using zcoll::float16_t;
using zcoll::ReduceOp;

template <typename T>
constexpr bool kIsHalf = std::is_same_v<T, float16_t> || std::is_same_v<T, bfloat16_t>;

// Integers wrap (two's complement, like numpy): fn runs on an unsigned type at least as wide as
// unsigned int (a narrower one would be promoted to int, where overflow is undefined).
template <typename T, typename Fn>
T wrapping(T a, T b, Fn fn) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;
    return static_cast<T>(fn(static_cast<U>(a), static_cast<U>(b)));
  } else {
    return fn(a, b);
  }
}

// The operations on scalars; apply() below adds float32 vectors.
struct Sum {
  template <typename T>
  T operator()(T a, T b) const {
    return wrapping(a, b, [](auto x, auto y) { return x + y; });
  }
};
struct Prod {
  template <typename T>
  T operator()(T a, T b) const {
    return wrapping(a, b, [](auto x, auto y) { return x * y; });
  }
};
// min / max propagate NaN: a if a is NaN, else the smaller (larger), which is b if b is NaN.
struct Min {
  template <typename T>
  T operator()(T a, T b) const {
    return (a < b || a != a) ? a : b;
  }
};
struct Max {
  template <typename T>
  T operator()(T a, T b) const {
    return (a > b || a != a) ? a : b;
  }
};
// Bitwise, on integers only (validate_op refuses them for other types; bool is uint8 here).
struct Band {
  template <typename T>
  T operator()(T a, T b) const {
    return static_cast<T>(a & b);
  }
};
struct Bor {
  template <typename T>
  T operator()(T a, T b) const {
    return static_cast<T>(a | b);
  }
};
struct Bxor {
  template <typename T>
  T operator()(T a, T b) const {
    return static_cast<T>(a ^ b);
  }
};
struct DivideBy {  // a / d (b unused)
  float d;
  float operator()(float a, float) const { return a / d; }
};
struct Convert {  // a (b unused): the loads and stores around it convert
  float operator()(float a, float) const { return a; }
};

template <typename Op, typename T>
T apply(Op op, T a, T b) {
  return op(a, b);
}
#if ZCOLL_KERNEL_SIMD
V::F apply(Sum, V::F a, V::F b) { return V::add(a, b); }
V::F apply(Prod, V::F a, V::F b) { return V::mul(a, b); }
V::F apply(Min, V::F a, V::F b) { return V::select(V::or_mask(V::lt(a, b), V::is_nan(a)), a, b); }
V::F apply(Max, V::F a, V::F b) { return V::select(V::or_mask(V::gt(a, b), V::is_nan(a)), a, b); }
V::F apply(DivideBy op, V::F a, V::F) { return V::div(a, V::set1(op.d)); }
V::F apply(Convert, V::F a, V::F) { return a; }
#endif

// out[i] = op(a[i], b[i]) where one of In / Out is a half type and the other float32 or the
// same: widen, op in float32, round (from_float is the identity for float).
template <typename Out, typename In, typename Op>
void float32_loop(Out* out, const In* a, const In* b, std::size_t n, Op op) {
  std::size_t i = 0;
#if ZCOLL_KERNEL_SIMD
  for (; i + kL <= n; i += kL) V::store(out + i, apply(op, V::load(a + i), V::load(b + i)));
#endif
  for (; i < n; ++i) out[i] = zcoll::from_float<Out>(apply(op, zcoll::to_float(a[i]), zcoll::to_float(b[i])));
}

template <typename T, typename Op>
void reduce_loop(T* out, const T* a, const T* b, std::size_t n, Op op) {
  if constexpr (kIsHalf<T>) {
    float32_loop(out, a, b, n, op);
  } else {
    for (std::size_t i = 0; i < n; ++i) out[i] = apply(op, a[i], b[i]);
  }
}

template <typename T>
void reduce_typed(T* out, const T* a, const T* b, std::size_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return reduce_loop(out, a, b, n, Sum{});
    case ReduceOp::kProd: return reduce_loop(out, a, b, n, Prod{});
    case ReduceOp::kMin: return reduce_loop(out, a, b, n, Min{});
    case ReduceOp::kMax: return reduce_loop(out, a, b, n, Max{});
    case ReduceOp::kBand:
    case ReduceOp::kBor:
    case ReduceOp::kBxor:
      if constexpr (std::is_integral_v<T>) {
        if (op == ReduceOp::kBand) return reduce_loop(out, a, b, n, Band{});
        if (op == ReduceOp::kBor) return reduce_loop(out, a, b, n, Bor{});
        return reduce_loop(out, a, b, n, Bxor{});
      }
      return;
  }
}

template <typename T>
void divide_typed(T* buf, std::size_t n, int divisor) {
  if constexpr (kIsHalf<T>) {
    float32_loop(buf, buf, buf, n, DivideBy{static_cast<float>(divisor)});
  } else if constexpr (std::is_floating_point_v<T>) {
    const T d = static_cast<T>(divisor);
    for (std::size_t i = 0; i < n; ++i) buf[i] = buf[i] / d;
  }
}

void reduce(void* out, const void* a, const void* b, std::size_t count, DType dtype, ReduceOp op) {
  zcoll::dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    reduce_typed(static_cast<T*>(out), static_cast<const T*>(a), static_cast<const T*>(b), count, op);
  });
}

void divide(void* buf, std::size_t count, DType dtype, int divisor) {
  zcoll::dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    divide_typed(static_cast<T*>(buf), count, divisor);
  });
}

void cast(const void* x, DType from, void* y, DType to, std::size_t n) {
  zcoll::dispatch_float_dtype(from, [&](auto in) {
    zcoll::dispatch_float_dtype(to, [&](auto out) {
      using In = typename decltype(in)::type;
      using Out = typename decltype(out)::type;
      const auto* src = static_cast<const In*>(x);
      if constexpr (kIsHalf<In> != kIsHalf<Out>) float32_loop(static_cast<Out*>(y), src, src, n, Convert{});
    });
  });
}
