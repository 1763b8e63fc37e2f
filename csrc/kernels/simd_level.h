// Which instruction set the kernels use: detected once at run time, overridable with the
// environment variable ZCOLL_SIMD=scalar|avx2|avx512 (never above what the CPU supports).
// The dispatchers in kernels/*.cc are the only places that branch on it.
#pragma once

namespace zcoll::kernels {

enum class SimdLevel : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

SimdLevel simd_level();            // the level in use (detected, then capped by ZCOLL_SIMD)
SimdLevel detected_simd_level();   // what the CPU supports
void set_simd_level(SimdLevel);    // for tests and benchmarks; capped by the CPU
const char* simd_level_name(SimdLevel);

}  // namespace zcoll::kernels
