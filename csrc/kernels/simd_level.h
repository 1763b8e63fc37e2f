// Which instruction set the kernels use: detected once at run time, overridable with the
// environment variable ZCOLL_SIMD=scalar|avx2|avx512 (never above what the CPU supports).
// kernel_table() (kernels/kernel_table.h) is the only place that branches on it.
#pragma once
#include <string>
#include <vector>

namespace zcoll::kernels {

enum class SimdLevel : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

SimdLevel simd_level();            // the level in use (detected, then capped by ZCOLL_SIMD)
SimdLevel detected_simd_level();   // what the CPU supports
void set_simd_level(SimdLevel);    // for tests and benchmarks; capped by the CPU
const char* simd_level_name(SimdLevel);

// The implementation a kernel call runs (every kernel takes one, last, defaulted to kDispatch):
// kDispatch follows simd_level(); the others force that ISA's kernel table (kScalar: the
// reference the others are tested against), and throw std::invalid_argument if the CPU lacks it.
enum class KernelImpl : int { kDispatch = -1, kScalar = 0, kAvx2 = 1, kAvx512 = 2 };
// "dispatch" | "scalar" | "avx2" | "avx512"; anything else throws std::invalid_argument.
KernelImpl parse_kernel_impl(const std::string& name);
const char* kernel_impl_name(KernelImpl impl);
// The explicit implementations this CPU runs: kScalar first, up to detected_simd_level().
std::vector<KernelImpl> supported_kernel_impls();

}  // namespace zcoll::kernels
