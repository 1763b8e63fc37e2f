// The dispatcher: the only place that chooses a kernel table by instruction set
// (kernels/kernel_table.h).
#include "kernels/kernel_table.h"

#include <stdexcept>
#include <string>

namespace zcoll::kernels {

const KernelTable& kernel_table(KernelImpl impl) {
  SimdLevel level = simd_level();
  if (impl != KernelImpl::kDispatch) {
    const int code = static_cast<int>(impl);
    if (code < static_cast<int>(SimdLevel::kScalar) || code > static_cast<int>(SimdLevel::kAvx512))
      throw std::invalid_argument("unknown kernel implementation code " + std::to_string(code));
    level = static_cast<SimdLevel>(code);
    if (level > detected_simd_level())
      throw std::invalid_argument(std::string("kernel implementation '") + simd_level_name(level) +
                                  "' is not supported by this CPU (it has " +
                                  simd_level_name(detected_simd_level()) + ")");
  }
  switch (level) {
    case SimdLevel::kAvx512: return kAvx512Kernels;
    case SimdLevel::kAvx2: return kAvx2Kernels;
    case SimdLevel::kScalar: break;
  }
  return kScalarKernels;
}

}  // namespace zcoll::kernels
