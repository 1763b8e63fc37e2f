// The scalar copy of the reduction loops (flags set per file in CMakeLists.txt).

#include <cstdint>
#include <type_traits>

#include "kernels/reduce.h"
#define ZCOLL_KERNEL_F16C 0

namespace zcoll::kernels::scalar {
#include "kernels/reduce_impl.h"
}  // namespace zcoll::kernels::scalar
