// The vector operations of the generic kernels for AVX2 + F16C: 8 float32 lanes. Same contract
// as simd_ops_avx512.h (read that file's header); included inside namespace zcoll::kernels::avx2.
namespace {

struct V {
  static constexpr int kLanes = 8;
  using F = __m256;
  using I = __m256i;
  using Mask = unsigned;

  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static F load(const zcoll::float16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static F load(const zcoll::bfloat16_t* p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
  static void store_f16(std::uint16_t* p, F v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static void store_bf16(std::uint16_t* p, F v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r =
        _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
    const __m256i qnan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    const __m256i nan =
        _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
    const __m256i h = _mm256_blendv_epi8(r, qnan, nan);  // 32-bit lanes, values <= 0xffff
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(h, h), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
  }
  static float widen(float v) { return v; }
  static float widen(zcoll::float16_t h) { return _cvtsh_ss(h.bits); }
  static float widen(zcoll::bfloat16_t h) { return qmath::bitsf(std::uint32_t(h.bits) << 16); }

  static F set1(float v) { return _mm256_set1_ps(v); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F div(F a, F b) { return _mm256_div_ps(a, b); }
  static F clamp(F v, F q) {
    return _mm256_min_ps(_mm256_max_ps(v, _mm256_sub_ps(_mm256_setzero_ps(), q)), q);
  }
  static F floor(F v) { return _mm256_floor_ps(v); }
  static F abs(F v) {
    return _mm256_castsi256_ps(_mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x7fffffff)));
  }
  static F neg(F v) {
    return _mm256_castsi256_ps(_mm256_xor_si256(_mm256_castps_si256(v), _mm256_set1_epi32(int(0x80000000u))));
  }
  static F zero() { return _mm256_setzero_ps(); }
  static I rint(F v) { return _mm256_cvtps_epi32(v); }
  static F to_float(I v) { return _mm256_cvtepi32_ps(v); }
  static F one_if_less(F a, F b) { return _mm256_and_ps(_mm256_cmp_ps(a, b, _CMP_LT_OQ), set1(1.0f)); }

  static I abs_bits(F v) { return _mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x7fffffff)); }
  static I max_u32(I a, I b) { return _mm256_max_epu32(a, b); }
  static I zero_i() { return _mm256_setzero_si256(); }
  static std::uint32_t hmax_u32(I v) {
    __m128i m = _mm_max_epu32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0x4e));
    m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0xb1));
    return std::uint32_t(_mm_cvtsi128_si32(m));
  }
  // Keys compared here are |x| bit patterns (< 2^31), so signed comparisons are exact.
  static Mask gt_u32(I a, std::uint32_t t) {
    if (t >= 0x80000000u) return 0;
    return unsigned(
        _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(a, _mm256_set1_epi32(int(t))))));
  }
  static Mask eq_u32(I a, std::uint32_t t) {
    return unsigned(
        _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpeq_epi32(a, _mm256_set1_epi32(int(t))))));
  }

  static I mix32(I x) {
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32(0x7feb352d));
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32(int(0x846ca68bu)));
    return _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
  }
  static I rng_u32(zcoll::RngKey k, std::uint64_t base) {
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const std::uint32_t b = std::uint32_t(base);
    const __m256i lo = _mm256_add_epi32(_mm256_set1_epi32(int(b)), iota);
    __m256i hi = _mm256_set1_epi32(int(std::uint32_t(base >> 32)));
    if (b > 0xffffffffu - 7u) {  // some lanes wrap: carry (lo < b, unsigned) into the high word
      const __m256i bias = _mm256_set1_epi32(int(0x80000000u));
      const __m256i wrapped =
          _mm256_cmpgt_epi32(_mm256_xor_si256(_mm256_set1_epi32(int(b)), bias), _mm256_xor_si256(lo, bias));
      hi = _mm256_sub_epi32(hi, wrapped);  // wrapped lanes are -1
    }
    const __m256i h = mix32(_mm256_xor_si256(lo, _mm256_set1_epi32(int(k.k0))));
    return mix32(_mm256_add_epi32(h, _mm256_xor_si256(hi, _mm256_set1_epi32(int(k.k1)))));
  }
  static F uniform(I h) {
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(h, 8)), set1(5.9604644775390625e-8f));
  }

  // 8 int32 codes -> their low bytes, in order, in the low 8 bytes of an __m128i.
  static __m128i low_bytes(I c) {
    const __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4,
                                          8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m256i b =
        _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(c, pick), _mm256_setr_epi32(0, 4, 1, 1, 1, 1, 1, 1));
    return _mm256_castsi256_si128(b);
  }
  static void store_i8(std::uint8_t* p, I c) {
    _mm_storel_epi64(reinterpret_cast<__m128i*>(p), low_bytes(c));
  }
  static I load_i8(const std::uint8_t* p) {
    return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  static void store_i4(std::uint8_t* p, I c) {
    const __m128i b = low_bytes(c);
    const __m128i w = _mm_or_si128(_mm_and_si128(b, _mm_set1_epi16(0x000f)),
                                   _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi16(0x00f0)));
    const int packed = _mm_cvtsi128_si32(_mm_packus_epi16(w, w));
    std::memcpy(p, &packed, 4);
  }
  static I load_i4(const std::uint8_t* p) {
    int v;
    std::memcpy(&v, p, 4);
    const __m128i w = _mm_cvtepu8_epi16(_mm_cvtsi32_si128(v));
    __m128i t = _mm_or_si128(_mm_and_si128(w, _mm_set1_epi16(0x0f)),
                             _mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0xf0)), 4));
    t = _mm_sub_epi8(_mm_xor_si128(t, _mm_set1_epi8(8)), _mm_set1_epi8(8));
    return _mm256_cvtepi8_epi32(t);
  }
  static Mask neg_bits(F v) {
    return unsigned(_mm256_movemask_ps(_mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_LT_OQ)));
  }
  static void store_bits(std::uint8_t* p, Mask m) { p[0] = static_cast<std::uint8_t>(m); }
  static Mask load_bits(const std::uint8_t* p) { return p[0]; }
  static F sign_decode(Mask m, F s) {
    const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    const __m256i set = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(int(m)), bit), bit);
    return _mm256_blendv_ps(s, neg(s), _mm256_castsi256_ps(set));
  }
};

}  // namespace
