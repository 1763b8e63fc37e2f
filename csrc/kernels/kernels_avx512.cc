// The avx512 kernel table: AVX-512 F/BW/VL/DQ + F16C (16 float32 lanes). The ISA's primitives
// (simd_ops_avx512.h), the vector operations written once over them (simd_ops.h) and the kernel
// skeletons, compiled here with this ISA's flags (CMakeLists.txt). Everything here has internal
// linkage except the table (kernels/kernel_table.h says why).
// GCC 12 warns inside its own AVX-512 headers (_mm512_undefined_*: GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "common/dtype.h"
#include "common/half.h"
#include "common/rng.h"
#include "kernels/kernel_table.h"
#include "kernels/quant_math.h"
#include "kernels/sparsify_math.h"

#define ZCOLL_KERNEL_SIMD 1

namespace zcoll::kernels::avx512 {
namespace {
// clang-format off: the primitives, the operations over them, then the kernels over those
#include "kernels/simd_ops_avx512.h"
#include "kernels/simd_ops.h"
#include "kernels/elementwise_impl.h"
#include "kernels/quantize_simd.h"
#include "kernels/sparsify_simd.h"
// clang-format on
}  // namespace
}  // namespace zcoll::kernels::avx512

namespace zcoll::kernels {
extern const KernelTable kAvx512Kernels = ZCOLL_KERNEL_TABLE(SimdLevel::kAvx512, avx512);
}  // namespace zcoll::kernels
