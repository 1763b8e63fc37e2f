// The one dispatch idiom of the CPU kernels, in the manner of Highway's HWY_EXPORT: every
// instruction set has ONE translation unit (kernels_scalar.cc, kernels_avx2.cc,
// kernels_avx512.cc, each compiled with its own flags, see CMakeLists.txt) that exports ONE
// KernelTable of its copies of all the kernels, and kernel_table(impl) is the only place that
// chooses among them. The public entry points (reduce.h, quantize.h, sparsify.h) validate their
// arguments, then call through kernel_table(impl).
//
// The kernels quartet:
//   public headers    reduce.h, quantize.h, sparsify.h: the contracts; every kernel takes
//                     `KernelImpl impl = kDispatch` last
//   scalar reference  kernels_scalar.cc (+ quantize_scalar.h, sparsify_scalar.h): plain loops
//                     over the element formulas, the oracle every table is tested against bit
//                     for bit (tests/core/test_kernels.py, tests/compression/test_compression_kernels.py)
//   one file per ISA  kernels_avx2.cc, kernels_avx512.cc: the vector primitives of the ISA
//                     (simd_ops_<isa>.h), the operations written once over them (simd_ops.h)
//                     and the kernel skeletons (elementwise_impl.h, quantize_simd.h,
//                     sparsify_simd.h), Highway's "skeleton" pattern
//   one dispatcher    kernel_table.cc: kDispatch -> simd_level() (ZCOLL_SIMD caps it), an
//                     explicit ISA the CPU lacks -> std::invalid_argument
//
// Entries trust their arguments: the entry points validated them and handled n == 0.
// Adding a kernel: a field here, its name in ZCOLL_KERNEL_TABLE, a definition in every ISA file.
//
// Why everything an ISA file defines has internal linkage (an anonymous namespace, or `static`
// in the shared headers common/half.h, common/rng.h, quant_math.h): an inline function compiled
// with -mavx512f and also used by the scalar file could be the one copy the linker keeps, and
// crash a CPU without AVX-512. Only the tables are exported.
#pragma once
#include <cstddef>
#include <cstdint>

#include "common/dtype.h"
#include "kernels/quantize.h"
#include "kernels/simd_level.h"

namespace zcoll::kernels {

struct KernelTable {
  SimdLevel level;
  // ---- reduce.h ----
  void (*reduce)(void* out, const void* a, const void* b, std::size_t count, DType dtype, ReduceOp op);
  void (*divide)(void* buf, std::size_t count, DType dtype, int divisor);  // floating dtypes only
  // ---- quantize.h (dtypes: float32, float16, bfloat16) ----
  QuantStatus (*quantize)(const void* x, DType dtype, std::size_t n, const QuantParams& p,
                          std::uint8_t* codes, float* scales);
  // y = D(q), or y += D(q) when accumulate.
  void (*dequantize)(const std::uint8_t* codes, const float* scales, std::size_t n, const QuantParams& p,
                     float* y, bool accumulate);
  QuantStatus (*dequantize_add_quantize)(const std::uint8_t* codes_in, const float* scales_in, const void* x,
                                         DType dtype, std::size_t n, const QuantParams& p,
                                         std::uint8_t* codes_out, float* scales_out, float* sum_out);
  QuantStatus (*quantize_ef)(const void* g, DType dtype, float* e, std::size_t n, const QuantParams& p,
                             std::uint8_t* codes, float* scales);
  // float32 -> float16 / bfloat16 or back.
  void (*cast)(const void* x, DType from, void* y, DType to, std::size_t n);
  // ---- sparsify.h: the passes over the whole vector (sampling and nth_element are ISA-free) ----
  // Keeps i when key(x[i]) > t, or key(x[i]) == t and fewer than eq_budget equal keys were kept
  // before it (eq_budget = SIZE_MAX: all of them); key = |x| bit pattern (sparsify_math.h).
  // Writes the first min(count, cap) pairs in index order; returns count.
  std::size_t (*select)(const float* x, std::size_t n, std::uint32_t t, std::size_t eq_budget,
                        std::uint32_t* idx, float* val, std::size_t cap);
  // The same on r = g + e, storing e[i] = r for every i.
  std::size_t (*select_ef)(const float* g, float* e, std::size_t n, std::uint32_t t, std::size_t eq_budget,
                           std::uint32_t* idx, float* val, std::size_t cap);
  // y[idx[i]] += val[i], in order i = 0 .. m-1 (indices checked by the caller).
  void (*scatter_add)(float* y, const std::uint32_t* idx, const float* val, std::size_t m);
};

// kDispatch -> the table of simd_level(); an explicit ISA -> its table, or std::invalid_argument
// when this CPU lacks it.
const KernelTable& kernel_table(KernelImpl impl);

// The tables, one per ISA file; reach them through kernel_table().
extern const KernelTable kScalarKernels;
extern const KernelTable kAvx2Kernels;
extern const KernelTable kAvx512Kernels;

}  // namespace zcoll::kernels

// An ISA file's table, from the kernels it defines under these names in its namespace `isa`.
// scatter_add is the one plain loop of sparsify_math.h, compiled in each file.
#define ZCOLL_KERNEL_TABLE(simd_level, isa)                                                             \
  ::zcoll::kernels::KernelTable {                                                                       \
    simd_level, isa::reduce, isa::divide, isa::quantize, isa::dequantize, isa::dequantize_add_quantize, \
        isa::quantize_ef, isa::cast, isa::select, isa::select_ef,                                       \
        ::zcoll::kernels::smath::scatter_add_in_order                                                   \
  }
