// The avx512 copy of the sparsification primitives (flags set per file in CMakeLists.txt).
// GCC 12 warns inside its own AVX-512 headers (_mm512_undefined_*: GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "common/half.h"
#include "common/rng.h"
#include "kernels/quant_math.h"
#include "kernels/sparsify_isa.h"

namespace zcoll::kernels::avx512 {
// clang-format off: the vector operations first, then the kernels written over them
#include "kernels/simd_ops_avx512.h"
#include "kernels/sparsify_simd.h"
// clang-format on
}  // namespace zcoll::kernels::avx512
