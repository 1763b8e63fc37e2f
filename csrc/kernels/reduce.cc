// The entry points of the reduction kernels (kernels/reduce.h): the table of `impl` does the work.
#include "kernels/reduce.h"

#include "kernels/kernel_table.h"

namespace zcoll::kernels {

// bool and complex reach the tables as the lanes reduce_lanes() names: the tables' loops over the
// eight numeric types are the only kernels (no per-type SIMD code for the others).
void reduce(void* out, const void* a, const void* b, std::size_t count, DType dtype, ReduceOp op,
            KernelImpl impl) {
  const KernelTable& k = kernel_table(impl);
  if (count == 0) return;
  const ReduceLanes l = reduce_lanes(dtype, op);
  k.reduce(out, a, b, count * l.lanes, l.dtype, l.op);
}

void divide(void* buf, std::size_t count, DType dtype, int divisor, KernelImpl impl) {
  const KernelTable& k = kernel_table(impl);
  if (count == 0 || divisor == 1) return;
  const ReduceLanes l = reduce_lanes(dtype, ReduceOp::kAvg);
  k.divide(buf, count * l.lanes, l.dtype, divisor);
}

}  // namespace zcoll::kernels
