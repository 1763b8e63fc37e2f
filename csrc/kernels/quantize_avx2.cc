// The avx2 copy of the quantization kernels (flags set per file in CMakeLists.txt).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "common/half.h"
#include "common/rng.h"
#include "kernels/quant_math.h"
#include "kernels/quantize_isa.h"

namespace zcoll::kernels::avx2 {
// clang-format off: the vector operations first, then the kernels written over them
#include "kernels/simd_ops_avx2.h"
#include "kernels/quantize_simd.h"
// clang-format on
}  // namespace zcoll::kernels::avx2
