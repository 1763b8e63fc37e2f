// The scalar kernel table: the reference every other table is tested against bit for bit.
// Plain loops over the element formulas (common/half.h, quant_math.h, sparsify_math.h),
// compiled with -fno-tree-vectorize (CMakeLists.txt) so that it stays what it reads like.
// Everything here has internal linkage except the table (kernels/kernel_table.h says why).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "common/dtype.h"
#include "common/half.h"
#include "common/rng.h"
#include "kernels/kernel_table.h"
#include "kernels/quant_math.h"
#include "kernels/sparsify_math.h"

#define ZCOLL_KERNEL_SIMD 0

namespace zcoll::kernels::scalar {
namespace {
// clang-format off: the elementwise skeleton, then the plain references
#include "kernels/elementwise_impl.h"
#include "kernels/quantize_scalar.h"
#include "kernels/sparsify_scalar.h"
// clang-format on
}  // namespace
}  // namespace zcoll::kernels::scalar

namespace zcoll::kernels {
extern const KernelTable kScalarKernels = ZCOLL_KERNEL_TABLE(SimdLevel::kScalar, scalar);
}  // namespace zcoll::kernels
