// CUDA blockwise quantization: the GPU counterpart of kernels/quantize.h, same QuantParams,
// payload layout, formulas (kernels/quant_math.h) and results, bit for bit (built with
// -fmad=false, IEEE division, round-to-nearest-even conversions). Plain C++ header: nvcc is
// needed only for quantize_cuda.cu (target zcoll_cuda, -DZCOLL_ENABLE_CUDA=ON).
//
// All pointers are device pointers; `stream` is a cudaStream_t (nullptr: the default stream).
// Calls are asynchronous on that stream; argument errors throw std::invalid_argument and CUDA
// errors zcoll::Error at once (launch errors are checked, execution errors surface later).
//
//   quantize     one CUDA block of 256 threads per quantization block:
//                1. absmax: strided integer max of |x| bits, warp shuffles, then shared memory
//                   (sign: threads 0..15 sum lane j's elements in the canonical order, then a
//                   shuffle tree l[j] + l[j+8], +4, +2, +1, exactly quant_math.h's sum16)
//                2. scale (thread 0 writes it; non-finite blocks add 1 to *nonfinite_blocks)
//                3. codes: a thread per int8 code, per int4 byte (2 codes), per sign byte (8)
//                Cost: one read of x, one write of codes + scales.
//   dequantize   a thread per code byte: y = D(q) or y += D(q). One read of codes, y.
#pragma once
#include <cstddef>
#include <cstdint>

#include "common/dtype.h"
#include "kernels/quantize.h"

namespace zcoll::cuda {

// x: n elements of dtype (float32, float16, bfloat16); codes / scales as quantize.h documents.
// nonfinite_blocks: a device counter (may be null) to which the number of blocks holding NaN or
// Inf is added; the caller zeroes it and reads it when convenient.
void quantize(const void* x, DType dtype, std::size_t n, const kernels::QuantParams& p, std::uint8_t* codes,
              float* scales, unsigned* nonfinite_blocks = nullptr, void* stream = nullptr);

// y = D(q) (accumulate false) or y += D(q) (accumulate true); y float32.
void dequantize(const std::uint8_t* codes, const float* scales, std::size_t n, const kernels::QuantParams& p,
                float* y, bool accumulate, void* stream = nullptr);

}  // namespace zcoll::cuda
