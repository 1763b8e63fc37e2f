// CUDA top-k by magnitude: the GPU counterpart of kernels::topk (kernels/sparsify.h), same
// selection (largest |x| bit patterns, ties by lower index, NaN > Inf > finite) and output
// (exactly k pairs in increasing index order, val[j] = x[idx[j]]). Plain C++ header; nvcc only
// for sparsify_cuda.cu.
//
//   1. keys = |x| bits, values = 0 .. n-1
//   2. cub::DeviceRadixSort::SortPairsDescending on 31 key bits (stable: ties keep index order)
//   3. the first k indices, sorted ascending (cub radix sort), and val = x[idx]
// Cost: two radix sorts (n pairs, then k keys): about 10 passes over 8n bytes. Exact and simple;
// a radix-select or the CPU's sampled threshold + compaction would be faster for k << n.
#pragma once
#include <cstddef>
#include <cstdint>

namespace zcoll::cuda {

// Device scratch topk needs for n elements (k <= n).
std::size_t topk_workspace_bytes(std::size_t n);

// x, idx (k), val (k), workspace: device pointers. Asynchronous on `stream` (a cudaStream_t).
void topk(const float* x, std::size_t n, std::size_t k, std::uint32_t* idx, float* val, void* workspace,
          std::size_t workspace_bytes, void* stream = nullptr);

}  // namespace zcoll::cuda
