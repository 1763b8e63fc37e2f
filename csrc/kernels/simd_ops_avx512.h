// The vector primitives of AVX-512 (F, BW, VL, DQ) + F16C: 16 float32 lanes. Only intrinsics,
// one per operation; everything built from them (bfloat16 rounding, the random numbers, code
// packing, ...) is written once for every ISA in simd_ops.h, which reads this file's contract:
//
//   F, I      16 float32 / 32-bit integer lanes;  Mask  a per-lane condition (here __mmask16)
//   loads/stores of float32 and float16 (F16C: exact widening; narrowing rounds to nearest even
//   like common/half.h float_to_fp16), of 16-bit lanes (load_u16 zero-extends, store_u16 keeps
//   the low 16 bits), low_bytes / from_i8 between int32 lanes and their bytes
//   the IEEE float32 operations the scalar formulas use (quant_math.h), never fused
//   32-bit integer arithmetic, signed comparisons, select
//   store_packed: the lanes a mask flags and their indices, packed to the front (top-k's select)
//
// Included in the anonymous namespace of kernels_avx512.cc, after <immintrin.h>.
struct Isa {
  static constexpr int kLanes = 16;
  using F = __m512;
  using I = __m512i;
  using Mask = __mmask16;

  // ---- memory ----
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
  static F load(const zcoll::float16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static void store(zcoll::float16_t* p, F v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static I load_u16(const std::uint16_t* p) {
    return _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static void store_u16(std::uint16_t* p, I v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(v));
  }
  static I load_u32(const std::uint32_t* p) { return _mm512_loadu_si512(p); }
  static __m128i low_bytes(I v) { return _mm512_cvtepi32_epi8(v); }  // lane j -> byte j
  static I from_i8(__m128i b) { return _mm512_cvtepi8_epi32(b); }    // byte j -> lane j, signed

  // ---- float32 ----
  static F set1(float v) { return _mm512_set1_ps(v); }
  static F zero() { return _mm512_setzero_ps(); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F div(F a, F b) { return _mm512_div_ps(a, b); }
  static F min(F a, F b) { return _mm512_min_ps(a, b); }  // (a < b) ? a : b, like minps
  static F max(F a, F b) { return _mm512_max_ps(a, b); }
  static F floor(F v) { return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); }
  static I rint(F v) { return _mm512_cvtps_epi32(v); }  // MXCSR default: nearest even
  static F to_float(I v) { return _mm512_cvtepi32_ps(v); }
  static I as_int(F v) { return _mm512_castps_si512(v); }
  static F as_float(I v) { return _mm512_castsi512_ps(v); }
  static Mask lt(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
  static Mask gt(F a, F b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
  static Mask is_nan(F v) { return _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q); }
  static F select(Mask m, F a, F b) { return _mm512_mask_blend_ps(m, b, a); }  // m ? a : b

  // ---- 32-bit integers ----
  static I set1_i(std::uint32_t v) { return _mm512_set1_epi32(int(v)); }
  static I zero_i() { return _mm512_setzero_si512(); }
  static I add_i(I a, I b) { return _mm512_add_epi32(a, b); }
  static I mullo(I a, I b) { return _mm512_mullo_epi32(a, b); }
  static I and_i(I a, I b) { return _mm512_and_si512(a, b); }
  static I or_i(I a, I b) { return _mm512_or_si512(a, b); }
  static I xor_i(I a, I b) { return _mm512_xor_si512(a, b); }
  template <int k>
  static I shr(I v) { return _mm512_srli_epi32(v, k); }
  template <int k>
  static I shl(I v) { return _mm512_slli_epi32(v, k); }
  static I max_u32(I a, I b) { return _mm512_max_epu32(a, b); }
  static std::uint32_t hmax_u32(I v) { return _mm512_reduce_max_epu32(v); }
  static Mask gt_i32(I a, I b) { return _mm512_cmpgt_epi32_mask(a, b); }
  static Mask eq_i32(I a, I b) { return _mm512_cmpeq_epi32_mask(a, b); }
  static I select_i(Mask m, I a, I b) { return _mm512_mask_blend_epi32(m, b, a); }

  // ---- masks ----
  static Mask or_mask(Mask a, Mask b) { return static_cast<Mask>(a | b); }
  static unsigned to_bits(Mask m) { return m; }  // lane j -> bit j
  static Mask from_bits(unsigned b) { return static_cast<Mask>(b); }

  // ---- selection ----
  // The lanes of v whose bit is set in m, packed to the front of val in lane order, and their
  // indices base + lane to the front of idx (vpcompressd); all kLanes lanes of both are written.
  static void store_packed(float* val, std::uint32_t* idx, unsigned m, F v, std::uint32_t base) {
    const I lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    _mm512_storeu_ps(val, _mm512_maskz_compress_ps(static_cast<Mask>(m), v));
    _mm512_storeu_si512(idx, _mm512_maskz_compress_epi32(static_cast<Mask>(m), add_i(set1_i(base), lanes)));
  }
};
