// Which instruction set the kernels use: detected once at run time, overridable with the
// environment variable ZCOLL_SIMD=scalar|avx2|avx512 (never above what the CPU supports).
// The dispatchers in kernels/*.cc are the only places that branch on it.
#pragma once
#include <string>

namespace zcoll::kernels {

enum class SimdLevel : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

SimdLevel simd_level();            // the level in use (detected, then capped by ZCOLL_SIMD)
SimdLevel detected_simd_level();   // what the CPU supports
void set_simd_level(SimdLevel);    // for tests and benchmarks; capped by the CPU
const char* simd_level_name(SimdLevel);

// An explicit choice of implementation, for kernels that take one (tests, benchmarks):
// kDispatch follows simd_level(); the others force that copy.
enum class KernelImpl : int { kDispatch = -1, kScalar = 0, kAvx2 = 1, kAvx512 = 2 };
// kDispatch -> simd_level(); an explicit level the CPU lacks throws std::invalid_argument.
SimdLevel resolve(KernelImpl impl);
// "dispatch" | "scalar" | "avx2" | "avx512"; anything else throws std::invalid_argument.
KernelImpl parse_kernel_impl(const std::string& name);

}  // namespace zcoll::kernels
