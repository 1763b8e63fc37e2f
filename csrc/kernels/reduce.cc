// The entry points of the reduction kernels (kernels/reduce.h): the table of `impl` does the work.
#include "kernels/reduce.h"

#include "config.h"
#include "kernels/kernel_table.h"
#if ZCOLL_WITH_SMPI
#include <smpi/smpi.h>
#endif

namespace zcoll::kernels {

// bool and complex reach the tables as the lanes reduce_lanes() names: the tables' loops over the
// eight numeric types are the only kernels (no per-type SIMD code for the others).
void reduce(void* out, const void* a, const void* b, std::size_t count, DType dtype, ReduceOp op,
            KernelImpl impl) {
  const KernelTable& k = kernel_table(impl);
  if (count == 0) return;
#if ZCOLL_WITH_SMPI
  // In a simulation the data is not real (every simulated rank shares one buffer, SMPI's shared
  // malloc) and the host's speed is not the platform's: the reduction costs its bytes at the
  // simulated host's speed, whose "flops" are bytes of one operand reduced per second
  // (bench/smpi_platforms). Deterministic, and a 1,024-rank run does not reduce 1,024 buffers.
  smpi_execute_flops(static_cast<double>(count * dtype_size(dtype)));
  return;
#endif
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
