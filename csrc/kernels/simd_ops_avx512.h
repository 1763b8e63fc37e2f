// The vector operations the generic kernels (quantize_simd.h, sparsify_simd.h) are written in,
// for AVX-512 (F, BW, VL, DQ) + F16C: 16 float32 lanes. Included inside namespace
// zcoll::kernels::avx512 by the *_avx512.cc files, after <immintrin.h>, "common/half.h" and
// "common/rng.h". Each operation is exactly the IEEE operation its scalar counterpart in
// quant_math.h performs, so results match the scalar reference bit for bit.
namespace {

struct V {
  static constexpr int kLanes = 16;
  using F = __m512;
  using I = __m512i;
  using Mask = unsigned;  // one bit per lane

  // ---- loads / stores of float data (f16/bf16 widened exactly) ----
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static F load(const zcoll::float16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static F load(const zcoll::bfloat16_t* p) {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
  static void store(float* p, F v) { _mm512_storeu_ps(p, v); }
  static void store_f16(std::uint16_t* p, F v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static void store_bf16(std::uint16_t* p, F v) {  // round to nearest even, NaN -> quiet NaN
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i r =
        _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
    const __m512i qnan = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, r, qnan)));
  }
  static float widen(float v) { return v; }
  static float widen(zcoll::float16_t h) { return _cvtsh_ss(h.bits); }
  static float widen(zcoll::bfloat16_t h) { return qmath::bitsf(std::uint32_t(h.bits) << 16); }

  // ---- arithmetic ----
  static F set1(float v) { return _mm512_set1_ps(v); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F div(F a, F b) { return _mm512_div_ps(a, b); }
  static F clamp(F v, F q) {
    return _mm512_min_ps(_mm512_max_ps(v, _mm512_sub_ps(_mm512_setzero_ps(), q)), q);
  }
  static F floor(F v) { return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); }
  static F abs(F v) {
    return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7fffffff)));
  }
  static F neg(F v) {
    return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(v), _mm512_set1_epi32(int(0x80000000u))));
  }
  static F zero() { return _mm512_setzero_ps(); }
  static I rint(F v) { return _mm512_cvtps_epi32(v); }  // MXCSR default: nearest even
  static F to_float(I v) { return _mm512_cvtepi32_ps(v); }
  // one where a < b, else zero
  static F one_if_less(F a, F b) {
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(a, b, _CMP_LT_OQ), set1(1.0f));
  }

  // ---- |x| bit patterns (compared as unsigned integers: NaN > Inf > finite) ----
  static I abs_bits(F v) { return _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7fffffff)); }
  static I max_u32(I a, I b) { return _mm512_max_epu32(a, b); }
  static I zero_i() { return _mm512_setzero_si512(); }
  static std::uint32_t hmax_u32(I v) { return _mm512_reduce_max_epu32(v); }
  static Mask gt_u32(I a, std::uint32_t t) { return _mm512_cmpgt_epu32_mask(a, _mm512_set1_epi32(int(t))); }
  static Mask eq_u32(I a, std::uint32_t t) { return _mm512_cmpeq_epu32_mask(a, _mm512_set1_epi32(int(t))); }

  // ---- counter-based random numbers (common/rng.h) for indices base .. base + 15 ----
  static I mix32(I x) {
    x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
    x = _mm512_mullo_epi32(x, _mm512_set1_epi32(0x7feb352d));
    x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 15));
    x = _mm512_mullo_epi32(x, _mm512_set1_epi32(int(0x846ca68bu)));
    return _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
  }
  static I rng_u32(zcoll::RngKey k, std::uint64_t base) {
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i lo = _mm512_add_epi32(_mm512_set1_epi32(int(std::uint32_t(base))), iota);
    __m512i hi = _mm512_set1_epi32(int(std::uint32_t(base >> 32)));
    // lanes whose low word wrapped carry into the high word
    hi = _mm512_mask_add_epi32(hi, _mm512_cmplt_epu32_mask(lo, _mm512_set1_epi32(int(std::uint32_t(base)))),
                               hi, _mm512_set1_epi32(1));
    const __m512i h = mix32(_mm512_xor_si512(lo, _mm512_set1_epi32(int(k.k0))));
    return mix32(_mm512_add_epi32(h, _mm512_xor_si512(hi, _mm512_set1_epi32(int(k.k1)))));
  }
  static F uniform(I h) {
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(h, 8)), set1(5.9604644775390625e-8f));
  }

  // ---- codes: int8 (16 bytes), int4 (8 bytes), sign bits (2 bytes) per vector ----
  static void store_i8(std::uint8_t* p, I c) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtepi32_epi8(c));
  }
  static I load_i8(const std::uint8_t* p) {
    return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static void store_i4(std::uint8_t* p, I c) {
    const __m128i b = _mm512_cvtepi32_epi8(c);  // one byte per code; pairs form 16-bit words
    const __m128i w = _mm_or_si128(_mm_and_si128(b, _mm_set1_epi16(0x000f)),
                                   _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi16(0x00f0)));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_packus_epi16(w, w));
  }
  static I load_i4(const std::uint8_t* p) {
    const __m128i w = _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    __m128i t = _mm_or_si128(_mm_and_si128(w, _mm_set1_epi16(0x0f)),
                             _mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0xf0)), 4));
    t = _mm_sub_epi8(_mm_xor_si128(t, _mm_set1_epi8(8)), _mm_set1_epi8(8));  // sign-extend 4 -> 8 bits
    return _mm512_cvtepi8_epi32(t);
  }
  static Mask neg_bits(F v) { return _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_LT_OQ); }
  static void store_bits(std::uint8_t* p, Mask m) {
    p[0] = static_cast<std::uint8_t>(m);
    p[1] = static_cast<std::uint8_t>(m >> 8);
  }
  static Mask load_bits(const std::uint8_t* p) { return unsigned(p[0]) | (unsigned(p[1]) << 8); }
  static F sign_decode(Mask m, F s) { return _mm512_mask_blend_ps(static_cast<__mmask16>(m), s, neg(s)); }
};

}  // namespace
