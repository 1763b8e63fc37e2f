// Dispatcher: the only place the reduction kernels branch on the instruction set.
#include "kernels/reduce.h"

#include "kernels/simd_level.h"

namespace zcoll::kernels {

void reduce(void* out, const void* a, const void* b, std::size_t count, DType dtype, ReduceOp op) {
  if (count == 0) return;
  switch (simd_level()) {
    case SimdLevel::kAvx512: return avx512::reduce(out, a, b, count, dtype, op);
    case SimdLevel::kAvx2: return avx2::reduce(out, a, b, count, dtype, op);
    case SimdLevel::kScalar: break;
  }
  scalar::reduce(out, a, b, count, dtype, op);
}

void divide(void* buf, std::size_t count, DType dtype, int divisor) {
  if (count == 0 || divisor == 1) return;
  switch (simd_level()) {
    case SimdLevel::kAvx512: return avx512::divide(buf, count, dtype, divisor);
    case SimdLevel::kAvx2: return avx2::divide(buf, count, dtype, divisor);
    case SimdLevel::kScalar: break;
  }
  scalar::divide(buf, count, dtype, divisor);
}

}  // namespace zcoll::kernels
