// The entry points of the reduction kernels (kernels/reduce.h): the table of `impl` does the work.
#include "kernels/reduce.h"

#include "kernels/kernel_table.h"

namespace zcoll::kernels {

void reduce(void* out, const void* a, const void* b, std::size_t count, DType dtype, ReduceOp op,
            KernelImpl impl) {
  const KernelTable& k = kernel_table(impl);
  if (count == 0) return;
  k.reduce(out, a, b, count, dtype, op);
}

void divide(void* buf, std::size_t count, DType dtype, int divisor, KernelImpl impl) {
  const KernelTable& k = kernel_table(impl);
  if (count == 0 || divisor == 1) return;
  k.divide(buf, count, dtype, divisor);
}

}  // namespace zcoll::kernels
