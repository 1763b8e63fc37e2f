// CUDA blockwise quantization (quantize_cuda.h): phases and cost are described there. The
// per-element formulas are kernels/quant_math.h's, shared with the CPU; additions and products
// use __fadd_rn / __fmul_rn (and the target is built with -fmad=false) so nothing is fused.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "common/half.h"
#include "cuda/cuda_check.h"
#include "cuda/quantize_cuda.h"
#include "kernels/quant_math.h"

namespace zcoll::cuda {
namespace {
using namespace zcoll::kernels::qmath;
constexpr int kThreads = 256;
constexpr unsigned kFull = 0xffffffffu;

// Widening to float32 is exact: bfloat16 goes through common/half.h (the one
// definition, host and device); float16 uses the hardware conversion, which is exact too and
// equals common/half.h fp16_to_float bit for bit (zcoll_cuda_check compares with the CPU).
__device__ __forceinline__ float widen(float v) { return v; }
__device__ __forceinline__ float widen(zcoll::float16_t h) { return __half2float(__ushort_as_half(h.bits)); }
__device__ __forceinline__ float widen(zcoll::bfloat16_t h) { return zcoll::to_float(h); }

// Warp 0: the sign quantizer's canonical sum (quant_math.h sum16) of |x| (times 2^-64 if rescale).
template <typename T>
__device__ float canonical_abs_sum(const T* x, std::size_t i0, std::size_t i1, bool rescale) {
  const unsigned lane = threadIdx.x;
  float acc = 0.0f;
  if (lane < 16)
    for (std::size_t i = i0 + lane; i < i1; i += 16) {
      const float a = __uint_as_float(abs_bits(widen(x[i])));
      acc = __fadd_rn(acc, rescale ? __fmul_rn(a, kSignRescale) : a);
    }
  for (int w = 8; w >= 1; w /= 2) {
    const float other = __shfl_down_sync(kFull, acc, w);
    if (lane < unsigned(w)) acc = __fadd_rn(acc, other);
  }
  return acc;  // lane 0
}

template <typename T, int kBits, bool kStochastic>
__device__ int code_at(const T* x, std::size_t i, float div, RngKey key, std::uint64_t offset) {
  constexpr int q = kBits == 8 ? 127 : 7;
  const float v = widen(x[i]);
  if (kStochastic) return code_stochastic(v, div, q, rng_u32(key, offset + i));
  return code_nearest(v, div, q);
}

template <typename T, int kBits, bool kStochastic>
__global__ void __launch_bounds__(kThreads)
    quantize_kernel(const T* x, std::size_t n, std::size_t block, RngKey key, std::uint64_t offset,
                    std::uint8_t* codes, float* scales, unsigned* nonfinite_blocks) {
  __shared__ std::uint32_t warp_max[kThreads / 32];
  __shared__ float block_scale_s;
  const unsigned tid = threadIdx.x;
  for (std::size_t b = blockIdx.x; b * block < n; b += gridDim.x) {
    const std::size_t i0 = b * block, i1 = min(n, i0 + block);
    // 1. absmax of the |x| bit patterns
    std::uint32_t m = 0;
    for (std::size_t i = i0 + tid; i < i1; i += kThreads) m = max(m, abs_bits(widen(x[i])));
    for (int o = 16; o > 0; o /= 2) m = max(m, __shfl_xor_sync(kFull, m, o));
    if (tid % 32 == 0) warp_max[tid / 32] = m;
    __syncthreads();
    // 2. scale, in warp 0
    if (tid < 32) {
      std::uint32_t amax = tid < kThreads / 32 ? warp_max[tid] : 0;
      for (int o = 16; o > 0; o /= 2) amax = max(amax, __shfl_xor_sync(kFull, amax, o));
      float scale = block_scale(amax, kBits == 1 ? 1 : qmax(kBits));
      if (kBits == 1 && !nonfinite(amax)) {
        float sum = canonical_abs_sum(x, i0, i1, false);
        const bool rescale = sign_sum_overflowed(__shfl_sync(kFull, sum, 0));
        if (rescale) sum = canonical_abs_sum(x, i0, i1, true);
        scale = sign_scale(sum, i1 - i0, amax, rescale);
      }
      if (tid == 0) {
        block_scale_s = scale;
        scales[b] = scale;
        if (nonfinite(amax) && nonfinite_blocks != nullptr) atomicAdd(nonfinite_blocks, 1u);
      }
    }
    __syncthreads();
    // 3. codes
    const float scale = block_scale_s;
    const bool bad = scale != scale;  // NaN: the block held NaN or Inf
    const float div = block_divisor(scale);
    if (kBits == 8) {
      for (std::size_t i = i0 + tid; i < i1; i += kThreads)
        codes[i] = static_cast<std::uint8_t>(bad ? 0 : code_at<T, 8, kStochastic>(x, i, div, key, offset));
    } else if (kBits == 4) {
      for (std::size_t i = i0 + 2 * tid; i < i1; i += 2 * kThreads) {
        const int c0 = bad ? 0 : code_at<T, 4, kStochastic>(x, i, div, key, offset);
        const int c1 = bad || i + 1 >= i1 ? 0 : code_at<T, 4, kStochastic>(x, i + 1, div, key, offset);
        codes[i / 2] = static_cast<std::uint8_t>(nibble(c0) | (nibble(c1) << 4));
      }
    } else {
      for (std::size_t i = i0 + 8 * tid; i < i1; i += 8 * kThreads) {
        unsigned byte = 0;
        for (unsigned t = 0; t < 8 && i + t < i1; ++t)
          byte |= (!bad && widen(x[i + t]) < 0.0f ? 1u : 0u) << t;
        codes[i / 8] = static_cast<std::uint8_t>(byte);
      }
    }
    __syncthreads();  // shared memory is reused by the next block
  }
}

// One thread per code byte: 1 (int8), 2 (int4) or 8 (sign) elements.
template <int kBits, bool kAccumulate>
__global__ void dequantize_kernel(const std::uint8_t* codes, const float* scales, std::size_t n,
                                  std::size_t block, float* y) {
  constexpr unsigned kPer = kBits == 8 ? 1 : kBits == 4 ? 2 : 8;
  const std::size_t units = (n + kPer - 1) / kPer;
  for (std::size_t u = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; u < units;
       u += std::size_t(blockDim.x) * gridDim.x) {
    const std::uint8_t byte = codes[u];
    for (unsigned t = 0; t < kPer && u * kPer + t < n; ++t) {
      const std::size_t i = u * kPer + t;
      const float s = scales[i / block];
      float d;
      if (kBits == 8)
        d = __fmul_rn(static_cast<float>(static_cast<std::int8_t>(byte)), s);
      else if (kBits == 4)
        d = __fmul_rn(static_cast<float>(unnibble(byte, t == 1)), s);
      else
        d = decode_sign(((byte >> t) & 1u) != 0, s);
      y[i] = kAccumulate ? __fadd_rn(y[i], d) : d;
    }
  }
}

unsigned grid_for(std::size_t work, unsigned threads) {
  return static_cast<unsigned>(std::min<std::size_t>((work + threads - 1) / threads, std::size_t(1) << 20));
}

template <typename T, int kBits>
void launch_quantize(const void* x, std::size_t n, const kernels::QuantParams& p, std::uint8_t* codes,
                     float* scales, unsigned* bad, cudaStream_t s) {
  const unsigned grid =
      static_cast<unsigned>(std::min(kernels::num_blocks(n, p.block), std::size_t(1) << 20));
  const RngKey key = rng_key(p.seed);
  const T* xt = static_cast<const T*>(x);
  if (kBits != 1 && p.rounding == kernels::Rounding::kStochastic)
    quantize_kernel<T, kBits, true>
        <<<grid, kThreads, 0, s>>>(xt, n, p.block, key, p.offset, codes, scales, bad);
  else
    quantize_kernel<T, kBits, false>
        <<<grid, kThreads, 0, s>>>(xt, n, p.block, key, p.offset, codes, scales, bad);
}

template <typename T>
void launch_bits(const void* x, std::size_t n, const kernels::QuantParams& p, std::uint8_t* codes,
                 float* scales, unsigned* bad, cudaStream_t s) {
  if (p.bits == 8)
    launch_quantize<T, 8>(x, n, p, codes, scales, bad, s);
  else if (p.bits == 4)
    launch_quantize<T, 4>(x, n, p, codes, scales, bad, s);
  else
    launch_quantize<T, 1>(x, n, p, codes, scales, bad, s);
}

}  // namespace

void quantize(const void* x, DType dtype, std::size_t n, const kernels::QuantParams& p, std::uint8_t* codes,
              float* scales, unsigned* nonfinite_blocks, void* stream) {
  kernels::validate(p);
  ZCOLL_REQUIRE(dtype == DType::kFloat32 || dtype == DType::kFloat16 || dtype == DType::kBFloat16,
                "CUDA quantize input must be float32, float16 or bfloat16, not ", dtype_name(dtype));
  if (n == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  if (dtype == DType::kFloat16)
    launch_bits<float16_t>(x, n, p, codes, scales, nonfinite_blocks, s);
  else if (dtype == DType::kBFloat16)
    launch_bits<bfloat16_t>(x, n, p, codes, scales, nonfinite_blocks, s);
  else
    launch_bits<float>(x, n, p, codes, scales, nonfinite_blocks, s);
  ZCOLL_CUDA_CHECK(cudaGetLastError());
}

void dequantize(const std::uint8_t* codes, const float* scales, std::size_t n, const kernels::QuantParams& p,
                float* y, bool accumulate, void* stream) {
  kernels::validate(p);
  if (n == 0) return;
  const auto s = static_cast<cudaStream_t>(stream);
  const std::size_t bytes = kernels::code_bytes(n, p.bits);
  const unsigned grid = grid_for(bytes, kThreads);
  auto go = [&](auto kernel) { kernel<<<grid, kThreads, 0, s>>>(codes, scales, n, p.block, y); };
  if (p.bits == 8)
    accumulate ? go(dequantize_kernel<8, true>) : go(dequantize_kernel<8, false>);
  else if (p.bits == 4)
    accumulate ? go(dequantize_kernel<4, true>) : go(dequantize_kernel<4, false>);
  else
    accumulate ? go(dequantize_kernel<1, true>) : go(dequantize_kernel<1, false>);
  ZCOLL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace zcoll::cuda
