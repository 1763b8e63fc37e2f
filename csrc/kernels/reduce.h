// Elementwise reduction kernels: the inner loop of every reducing collective.
//
//   reduce(out, a, b, n):  out[i] = a[i] OP b[i]   (OP: sum prod min max band bor bxor; avg
//                                                    reduces with sum)
//   divide(buf, n, p):     buf[i] = buf[i] / p      (the last step of avg, floating and complex
//                                                    types only; a no-op on integers)
// Cost: one pass, 3 (reduce) or 2 (divide) element accesses per element; memory bound.
//
// Semantics, identical in every kernel table (the SIMD ones are tested bit for bit against the
// scalar reference; the loops are kernels/elementwise_impl.h):
//   - integers wrap on overflow (two's complement), like numpy;
//   - float16 / bfloat16 are computed in float32 and rounded once to nearest even, which is
//     the correctly rounded half result (common/half.h, the one rounding routine);
//   - min / max propagate NaN: if a[i] is NaN the result is a[i], else if b[i] is NaN, b[i];
//   - band / bor / bxor: bitwise, integers and bool;
//   - complex types are two lanes of their real type (sum, avg componentwise); bool is uint8
//     with sum / max as or and prod / min as and (common/dtype.h, reduce_lanes), so 0/1 stay 0/1.
// `out` may alias `a` or `b` exactly (in-place reduction); partial overlap is not allowed.
#pragma once
#include <cstddef>

#include "common/dtype.h"
#include "kernels/simd_level.h"

namespace zcoll::kernels {

// `impl` picks the kernel table (kernels/kernel_table.h): kDispatch follows simd_level(),
// kScalar is the plain-loop reference (the test oracle), an ISA this CPU lacks throws
// std::invalid_argument. count == 0 (and divisor == 1) do nothing.
void reduce(void* out, const void* a, const void* b, std::size_t count, DType dtype, ReduceOp op,
            KernelImpl impl = KernelImpl::kDispatch);
void divide(void* buf, std::size_t count, DType dtype, int divisor, KernelImpl impl = KernelImpl::kDispatch);

}  // namespace zcoll::kernels
