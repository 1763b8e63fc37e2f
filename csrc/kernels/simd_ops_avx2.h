// The vector primitives of AVX2 + F16C: 8 float32 lanes. Same contract as simd_ops_avx512.h
// (read that file's header); Mask is a vector whose lanes are all ones or all zeros.
// Included in the anonymous namespace of kernels_avx2.cc, after <immintrin.h>.

// For each 8-bit mask, the lanes of its set bits in order, 4 bits each from the lowest nibble:
// the permutation that packs those lanes to the front (AVX2 has no compress instruction).
struct PackTable {
  std::uint32_t perm[256];
  constexpr PackTable() : perm() {
    for (unsigned m = 0; m < 256; ++m)
      for (unsigned j = 0, c = 0; j < 8; ++j)
        if ((m >> j) & 1u) perm[m] |= j << (4 * c++);
  }
};
constexpr PackTable kPackTable{};

struct Isa {
  static constexpr int kLanes = 8;
  using F = __m256;
  using I = __m256i;
  using Mask = __m256i;

  // ---- memory ----
  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, F v) { _mm256_storeu_ps(p, v); }
  static F load(const zcoll::float16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static void store(zcoll::float16_t* p, F v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  static I load_u16(const std::uint16_t* p) {
    return _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static void store_u16(std::uint16_t* p, I v) {  // lanes <= 0xffff: unsigned saturation is exact
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(v, v), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
  }
  static I load_u32(const std::uint32_t* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
  static __m128i low_bytes(I v) {  // lane j -> byte j (bytes 0..7)
    const __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4,
                                          8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m256i b =
        _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(v, pick), _mm256_setr_epi32(0, 4, 1, 1, 1, 1, 1, 1));
    return _mm256_castsi256_si128(b);
  }
  static I from_i8(__m128i b) { return _mm256_cvtepi8_epi32(b); }  // byte j -> lane j, signed

  // ---- float32 ----
  static F set1(float v) { return _mm256_set1_ps(v); }
  static F zero() { return _mm256_setzero_ps(); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F div(F a, F b) { return _mm256_div_ps(a, b); }
  static F min(F a, F b) { return _mm256_min_ps(a, b); }  // (a < b) ? a : b, like minps
  static F max(F a, F b) { return _mm256_max_ps(a, b); }
  static F floor(F v) { return _mm256_floor_ps(v); }
  static I rint(F v) { return _mm256_cvtps_epi32(v); }  // MXCSR default: nearest even
  static F to_float(I v) { return _mm256_cvtepi32_ps(v); }
  static I as_int(F v) { return _mm256_castps_si256(v); }
  static F as_float(I v) { return _mm256_castsi256_ps(v); }
  static Mask lt(F a, F b) { return as_int(_mm256_cmp_ps(a, b, _CMP_LT_OQ)); }
  static Mask gt(F a, F b) { return as_int(_mm256_cmp_ps(a, b, _CMP_GT_OQ)); }
  static Mask is_nan(F v) { return as_int(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)); }
  static F select(Mask m, F a, F b) { return _mm256_blendv_ps(b, a, as_float(m)); }  // m ? a : b

  // ---- 32-bit integers ----
  static I set1_i(std::uint32_t v) { return _mm256_set1_epi32(int(v)); }
  static I zero_i() { return _mm256_setzero_si256(); }
  static I add_i(I a, I b) { return _mm256_add_epi32(a, b); }
  static I mullo(I a, I b) { return _mm256_mullo_epi32(a, b); }
  static I and_i(I a, I b) { return _mm256_and_si256(a, b); }
  static I or_i(I a, I b) { return _mm256_or_si256(a, b); }
  static I xor_i(I a, I b) { return _mm256_xor_si256(a, b); }
  template <int k>
  static I shr(I v) { return _mm256_srli_epi32(v, k); }
  template <int k>
  static I shl(I v) { return _mm256_slli_epi32(v, k); }
  static I max_u32(I a, I b) { return _mm256_max_epu32(a, b); }
  static std::uint32_t hmax_u32(I v) {
    __m128i m = _mm_max_epu32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0x4e));
    m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0xb1));
    return std::uint32_t(_mm_cvtsi128_si32(m));
  }
  static Mask gt_i32(I a, I b) { return _mm256_cmpgt_epi32(a, b); }
  static Mask eq_i32(I a, I b) { return _mm256_cmpeq_epi32(a, b); }
  static I select_i(Mask m, I a, I b) { return _mm256_blendv_epi8(b, a, m); }

  // ---- masks ----
  static Mask or_mask(Mask a, Mask b) { return _mm256_or_si256(a, b); }
  static unsigned to_bits(Mask m) { return unsigned(_mm256_movemask_ps(as_float(m))); }  // lane j -> bit j
  static Mask from_bits(unsigned b) {
    const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    return _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(int(b)), bit), bit);
  }

  // ---- selection ----
  // The lanes of v whose bit is set in m, packed to the front of val in lane order, and their
  // indices base + lane to the front of idx (a table permutation); all kLanes lanes are written.
  static void store_packed(float* val, std::uint32_t* idx, unsigned m, F v, std::uint32_t base) {
    const I shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    const I perm = and_i(_mm256_srlv_epi32(set1_i(kPackTable.perm[m]), shifts), set1_i(7));
    _mm256_storeu_ps(val, _mm256_permutevar8x32_ps(v, perm));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(idx), add_i(set1_i(base), perm));
  }
};
