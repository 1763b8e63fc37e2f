// The avx2 copy of the reduction loops (flags set per file in CMakeLists.txt).
#include <immintrin.h>

#include <cstdint>
#include <type_traits>

#include "kernels/reduce.h"
#define ZCOLL_KERNEL_F16C 1

namespace zcoll::kernels::avx2 {
#include "kernels/reduce_impl.h"
}  // namespace zcoll::kernels::avx2
