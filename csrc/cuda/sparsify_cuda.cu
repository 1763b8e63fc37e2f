// CUDA top-k by magnitude (sparsify_cuda.h): two stable cub radix sorts. Phases and cost are
// described in the header.
#include <cuda_runtime.h>

#include <algorithm>
#include <cub/cub.cuh>
#include <limits>

#include "cuda/cuda_check.h"
#include "cuda/sparsify_cuda.h"
#include "kernels/quant_math.h"

namespace zcoll::cuda {
namespace {

__global__ void keys_kernel(const float* x, std::size_t n, std::uint32_t* keys, std::uint32_t* index) {
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += std::size_t(blockDim.x) * gridDim.x) {
    keys[i] = kernels::qmath::abs_bits(x[i]);
    index[i] = static_cast<std::uint32_t>(i);
  }
}

__global__ void gather_kernel(const float* x, const std::uint32_t* idx, std::size_t k, float* val) {
  for (std::size_t j = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; j < k;
       j += std::size_t(blockDim.x) * gridDim.x)
    val[j] = x[idx[j]];
}

unsigned grid_for(std::size_t work) {
  return static_cast<unsigned>(std::min<std::size_t>((work + 255) / 256, std::size_t(1) << 20));
}

std::size_t align(std::size_t bytes) { return (bytes + 255) / 256 * 256; }

// cub's scratch for both sorts (the larger), for n pairs.
std::size_t cub_bytes(std::size_t n) {
  std::size_t pairs = 0, keys = 0;
  const int m = static_cast<int>(n);
  ZCOLL_CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(
      nullptr, pairs, static_cast<std::uint32_t*>(nullptr), static_cast<std::uint32_t*>(nullptr),
      static_cast<std::uint32_t*>(nullptr), static_cast<std::uint32_t*>(nullptr), m, 0, 31));
  ZCOLL_CUDA_CHECK(cub::DeviceRadixSort::SortKeys(nullptr, keys, static_cast<std::uint32_t*>(nullptr),
                                                  static_cast<std::uint32_t*>(nullptr), m, 0, 32));
  return std::max(pairs, keys);
}

}  // namespace

std::size_t topk_workspace_bytes(std::size_t n) { return 4 * align(4 * n) + align(cub_bytes(n)); }

void topk(const float* x, std::size_t n, std::size_t k, std::uint32_t* idx, float* val, void* workspace,
          std::size_t workspace_bytes, void* stream) {
  ZCOLL_REQUIRE(n <= std::size_t(std::numeric_limits<int>::max()), "CUDA top-k handles n < 2^31, not ", n);
  ZCOLL_REQUIRE(k <= n, "k = ", k, " is larger than the number of elements n = ", n);
  if (k == 0) return;
  const std::size_t need = topk_workspace_bytes(n);
  ZCOLL_REQUIRE(workspace_bytes >= need, "CUDA top-k needs ", need, " bytes of workspace, got ",
                workspace_bytes);
  const auto s = static_cast<cudaStream_t>(stream);
  auto* base = static_cast<char*>(workspace);
  auto* keys_in = reinterpret_cast<std::uint32_t*>(base);
  auto* keys_out = reinterpret_cast<std::uint32_t*>(base + align(4 * n));
  auto* index_in = reinterpret_cast<std::uint32_t*>(base + 2 * align(4 * n));
  auto* index_out = reinterpret_cast<std::uint32_t*>(base + 3 * align(4 * n));
  void* temp = base + 4 * align(4 * n);
  const std::size_t temp_bytes = workspace_bytes - 4 * align(4 * n);
  std::size_t sort1_bytes = temp_bytes, sort2_bytes = temp_bytes;  // cub takes them by reference
  const int m = static_cast<int>(n);
  // 1. keys and indices
  keys_kernel<<<grid_for(n), 256, 0, s>>>(x, n, keys_in, index_in);
  ZCOLL_CUDA_CHECK(cudaGetLastError());
  // 2. stable descending sort by |x| bits (31 bits: the sign bit is cleared)
  ZCOLL_CUDA_CHECK(cub::DeviceRadixSort::SortPairsDescending(temp, sort1_bytes, keys_in, keys_out, index_in,
                                                             index_out, m, 0, 31, s));
  // 3. the k first indices in increasing order, then their values
  ZCOLL_CUDA_CHECK(
      cub::DeviceRadixSort::SortKeys(temp, sort2_bytes, index_out, idx, static_cast<int>(k), 0, 32, s));
  gather_kernel<<<grid_for(k), 256, 0, s>>>(x, idx, k, val);
  ZCOLL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace zcoll::cuda
