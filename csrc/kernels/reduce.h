// Elementwise reduction kernels: the inner loop of every reducing collective.
//
//   reduce(out, a, b, n):  out[i] = a[i] OP b[i]   (OP: sum prod min max; avg reduces with sum)
//   divide(buf, n, p):     buf[i] = buf[i] / p      (the last step of avg, floating types only)
//
// Semantics, identical in every implementation (the SIMD ones are tested bit for bit against
// the scalar reference):
//   - integers wrap on overflow (two's complement), like numpy;
//   - float16 / bfloat16 are computed in float32 and rounded once to nearest even, which is
//     the correctly rounded half result (see common/half.h);
//   - min / max propagate NaN: if a[i] is NaN the result is a[i], else if b[i] is NaN, b[i].
// `out` may alias `a` or `b` exactly (in-place reduction); partial overlap is not allowed.
#pragma once
#include <cstddef>

#include "common/dtype.h"

namespace zcoll::kernels {

void reduce(void* out, const void* a, const void* b, std::size_t count, DType dtype, ReduceOp op);
void divide(void* buf, std::size_t count, DType dtype, int divisor);

// The plain-loop reference (compiled without vectorisation): the test oracle.
namespace scalar {
void reduce(void* out, const void* a, const void* b, std::size_t count, DType dtype, ReduceOp op);
void divide(void* buf, std::size_t count, DType dtype, int divisor);
}  // namespace scalar

namespace avx2 {
void reduce(void* out, const void* a, const void* b, std::size_t count, DType dtype, ReduceOp op);
void divide(void* buf, std::size_t count, DType dtype, int divisor);
}  // namespace avx2

namespace avx512 {
void reduce(void* out, const void* a, const void* b, std::size_t count, DType dtype, ReduceOp op);
void divide(void* buf, std::size_t count, DType dtype, int divisor);
}  // namespace avx512

}  // namespace zcoll::kernels
