// Every CUDA runtime call is checked: failures throw zcoll::Error naming the call, file and line.
// Included by .cu files only.
#pragma once
#include <cuda_runtime_api.h>

#include "common/check.h"

#define ZCOLL_CUDA_CHECK(call)                                                                    \
  do {                                                                                            \
    const cudaError_t zcoll_err_ = (call);                                                        \
    if (zcoll_err_ != cudaSuccess)                                                                \
      throw ::zcoll::Error(::zcoll::detail::concat(__FILE__, ":", __LINE__, ": ", #call,          \
                                                   " failed: ", cudaGetErrorString(zcoll_err_))); \
  } while (0)
