// The vector operations the kernel skeletons (elementwise_impl.h, quantize_simd.h,
// sparsify_simd.h) are written in: V, built ONCE for every ISA over that ISA's primitives `Isa`
// (simd_ops_avx2.h, simd_ops_avx512.h; their header states the contract). Each operation is
// exactly what its scalar counterpart computes (common/half.h, common/rng.h, quant_math.h), so
// every table matches the scalar reference bit for bit. The 128-bit code packing uses SSE4.1,
// which both ISAs have. Included in the anonymous namespace of kernels_<isa>.cc, after
// simd_ops_<isa>.h.
struct V : Isa {
  using Bits = unsigned;  // one bit per lane, lane j in bit j (sign codes, selection scans)
  using Isa::load;
  using Isa::store;

  // ---- bfloat16 (common/half.h: bf16_to_float, float_to_bf16) ----
  static F load(const zcoll::bfloat16_t* p) {
    return as_float(shl<16>(load_u16(reinterpret_cast<const std::uint16_t*>(p))));
  }
  // Round to nearest even (add 0x7fff plus the lowest kept bit, drop 16 bits); NaN: quiet it.
  static I bf16_bits(F v) {
    const I u = as_int(v);
    const I rounded = shr<16>(add_i(add_i(u, set1_i(0x7fffu)), and_i(shr<16>(u), set1_i(1))));
    const I quiet_nan = or_i(shr<16>(u), set1_i(0x40u));
    const Mask nan = gt_i32(and_i(u, set1_i(0x7fffffffu)), set1_i(0x7f800000u));  // both < 2^31
    return select_i(nan, quiet_nan, rounded);
  }
  static void store(zcoll::bfloat16_t* p, F v) {
    store_u16(reinterpret_cast<std::uint16_t*>(p), bf16_bits(v));
  }

  // ---- float32 bit patterns and the quantizer's clamp (quant_math.h) ----
  static I abs_bits(F v) { return and_i(as_int(v), set1_i(0x7fffffffu)); }
  static F abs(F v) { return as_float(abs_bits(v)); }
  static F neg(F v) { return as_float(xor_i(as_int(v), set1_i(0x80000000u))); }
  static F clamp(F v, F q) { return min(max(v, sub(zero(), q)), q); }  // v not NaN
  static F one_if_less(F a, F b) { return select(lt(a, b), set1(1.0f), zero()); }

  // ---- counter-based random numbers (common/rng.h) for indices base .. base + kLanes - 1 ----
  static I mix32(I x) {
    x = xor_i(x, shr<16>(x));
    x = mullo(x, set1_i(0x7feb352du));
    x = xor_i(x, shr<15>(x));
    x = mullo(x, set1_i(0x846ca68bu));
    return xor_i(x, shr<16>(x));
  }
  static Mask lt_u32(I a, I b) {
    const I bias = set1_i(0x80000000u);
    return gt_i32(xor_i(b, bias), xor_i(a, bias));
  }
  static constexpr std::uint32_t kIota[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
  static I rng_u32(zcoll::RngKey k, std::uint64_t base) {
    const std::uint32_t b = static_cast<std::uint32_t>(base);
    const I lo = add_i(set1_i(b), load_u32(kIota));
    I hi = set1_i(static_cast<std::uint32_t>(base >> 32));
    if (b > 0xffffffffu - (kLanes - 1))  // some lanes' low words wrap: carry into their high word
      hi = select_i(lt_u32(lo, set1_i(b)), add_i(hi, set1_i(1)), hi);
    return mix32(add_i(mix32(xor_i(lo, set1_i(k.k0))), xor_i(hi, set1_i(k.k1))));
  }
  static F uniform(I h) { return mul(to_float(shr<8>(h)), set1(5.9604644775390625e-8f)); }  // * 2^-24

  // ---- codes in the payload layout of kernels/quantize.h, kLanes codes per call ----
  static void store_i8(std::uint8_t* p, I c) {
    const __m128i b = low_bytes(c);
    std::memcpy(p, &b, kLanes);
  }
  static I load_i8(const std::uint8_t* p) {
    __m128i b = _mm_setzero_si128();
    std::memcpy(&b, p, kLanes);
    return from_i8(b);
  }
  static void store_i4(std::uint8_t* p, I c) {
    const __m128i b = low_bytes(c);  // code j in byte j: bytes 2m, 2m+1 form 16-bit word m
    const __m128i w = _mm_or_si128(_mm_and_si128(b, _mm_set1_epi16(0x000f)),
                                   _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi16(0x00f0)));
    const __m128i packed = _mm_packus_epi16(w, w);  // words <= 0xff: one byte each
    std::memcpy(p, &packed, kLanes / 2);
  }
  static I load_i4(const std::uint8_t* p) {
    __m128i packed = _mm_setzero_si128();
    std::memcpy(&packed, p, kLanes / 2);
    const __m128i w = _mm_cvtepu8_epi16(packed);
    __m128i t = _mm_or_si128(_mm_and_si128(w, _mm_set1_epi16(0x0f)),
                             _mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0xf0)), 4));
    t = _mm_sub_epi8(_mm_xor_si128(t, _mm_set1_epi8(8)), _mm_set1_epi8(8));  // sign-extend 4 -> 8 bits
    return from_i8(t);
  }
  static Bits neg_bits(F v) { return to_bits(lt(v, zero())); }
  static void store_bits(std::uint8_t* p, Bits m) { std::memcpy(p, &m, kLanes / 8); }  // x86: little-endian
  static Bits load_bits(const std::uint8_t* p) {
    Bits m = 0;
    std::memcpy(&m, p, kLanes / 8);
    return m;
  }
  static F sign_decode(Bits m, F s) { return select(from_bits(m), neg(s), s); }

  // ---- selection keys: |x| bit patterns, < 2^31, so signed comparisons are exact ----
  static Bits gt_u32(I keys, std::uint32_t t) {
    return t >= 0x80000000u ? 0 : to_bits(gt_i32(keys, set1_i(t)));
  }
  static Bits eq_u32(I keys, std::uint32_t t) { return to_bits(eq_i32(keys, set1_i(t))); }
};

constexpr std::size_t kL = V::kLanes;
