// ZCOLL_HD marks a header function that the CPU code and, under nvcc, the CUDA kernels share
// (__host__ __device__), so both compute from one definition. Header functions that kernels use
// are also `static` (internal linkage): every translation unit keeps its own copy, compiled with
// its own instruction-set flags (see kernels/kernel_table.h for why that matters).
#pragma once

#if defined(__CUDACC__)
#define ZCOLL_HD __host__ __device__ __forceinline__
#else
#define ZCOLL_HD inline
#endif
