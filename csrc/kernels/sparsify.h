// Sparsifiers: choose (uint32 index, float32 value) pairs of a float32 vector, and the fused
// scatter-add that decodes them. Top-k payloads cannot be summed by a plain allreduce (indices
// differ per rank): they travel by allgather or a sparse ring and are applied with scatter_add.
//
// ---- Kernels ------------------------------------------------------------------------------
//   topk              the k elements of largest |x|: exactly k pairs
//   topk_ef           error feedback fused in: r = g + e; pick top-k of r; e = r, then e = 0 at
//                     the picked indices (what was sent leaves the residual)
//   topk_threshold    a sampled estimate t with about k elements |x| > t (DGC-style, cheap)
//   threshold         every element with |x| > t (t >= 0)
//   randomk           k distinct indices drawn uniformly for a seed (same seed, same indices on
//                     every rank: the values can then be summed by a dense allreduce)
//   scatter_add       y[idx[i]] += val[i], in order i = 0 .. m-1 (duplicates add up)
//
// ---- Output -----------------------------------------------------------------------------------
// Pairs are written to idx[0..c) / val[0..c) in increasing index order; val[j] = x[idx[j]]
// (bit for bit, r's value for topk_ef). Indices are uint32: n must be < 2^32.
// Magnitude order is the order of |x| bit patterns as unsigned integers: NaN > +Inf > finite,
// so NaN and Inf are selected first (and the caller, who sees val, can flag them); -0 == +0.
// Ties at the k-th magnitude are broken by lower index first, so the selection is a function of
// the input alone, identical in every implementation and for both top-k methods.
//
// ---- Top-k methods ------------------------------------------------------------------------
//   kExact    |x| bits of all n elements, std::nth_element, then one selection pass.
//             Cost: 4n bytes of scratch, O(n) but ~20 ns per element (0.2-0.4 GB/s).
//   kSampled  1. |x| of s = clamp(n/128, 512, 65536) elements (`sample` when given: a segment of
//                a larger tensor passes topk_sample_share, its share of the whole tensor's s, so
//                cutting a tensor into segments does not multiply its sampling), one at a seeded
//                random position in each of s equal strata (increasing addresses: the
//                prefetcher follows);
//             2. T = the sample's r-th largest, r = mu + 2 sqrt(mu) + 2, mu = s k / n, so that
//                |x| >= T holds for about 2 sigma more than k elements;
//             3. one vectorised compaction pass keeps (i, x[i]) with |x[i]| > T and the first
//                k with |x[i]| == T (about k (1 + 2 / sqrt(mu)) candidates; ties at T, e.g.
//                zeros, are capped). Fewer than k (T too high, about 1 call in 100-200 at the
//                smallest samples): once more with r = mu + 4 sqrt(mu) + 4;
//             4. exact selection (a histogram of the candidates' keys, nth_element in the bin
//                of the k-th) fixes the result to exactly the k that kExact returns (every
//                top-k element is a candidate).
//             If the sample misjudged twice (fewer than k or too many candidates, probability
//             ~1e-5) it falls back to kExact: same result, slower.
//             Cost: one read of x (DRAM speed) + O(s + k) work; scratch ~40 k bytes kept
//             per thread. Used when n >= 16384 and k <= n / 4; otherwise kExact.
// `impl` picks the kernel table of the passes over the whole vector (kernels/kernel_table.h);
// topk_threshold and randomk have none (a sample, a bitmap). CUDA counterpart of topk:
// csrc/cuda/sparsify_cuda.h.
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/simd_level.h"

namespace zcoll::kernels {

enum class TopkMethod : int { kExact = 0, kSampled = 1 };

// Writes exactly k pairs (k <= n, else std::invalid_argument). The seed and `sample` (positions
// sampled, 0: topk_sample_size(n)) only steer sampling: the pairs are the same for any of them.
void topk(const float* x, std::size_t n, std::size_t k, std::uint32_t* idx, float* val,
          TopkMethod method = TopkMethod::kSampled, std::uint64_t seed = 0,
          KernelImpl impl = KernelImpl::kDispatch, std::size_t sample = 0);

// r = g + e; top-k of r into (idx, val); e = r except e[idx[j]] = 0. e is in/out (float32).
void topk_ef(const float* g, float* e, std::size_t n, std::size_t k, std::uint32_t* idx, float* val,
             TopkMethod method = TopkMethod::kSampled, std::uint64_t seed = 0,
             KernelImpl impl = KernelImpl::kDispatch, std::size_t sample = 0);

// kSampled's sample of n elements: clamp(n / 128, 512, 65536).
std::size_t topk_sample_size(std::size_t n);

// The sample of a segment of n elements of a tensor of `total`: its share of
// topk_sample_size(total), at least min(256, n), at most topk_sample_size(n).
std::size_t topk_sample_share(std::size_t total, std::size_t n);

// A threshold t for which about k elements have |x| > t, from a seeded sample (no pass over x).
float topk_threshold(const float* x, std::size_t n, std::size_t k, std::uint64_t seed = 0);

// Pairs for |x[i]| > t (t >= 0, not NaN): writes the first min(count, capacity), returns count.
std::size_t threshold(const float* x, std::size_t n, float t, std::uint32_t* idx, float* val,
                      std::size_t capacity, KernelImpl impl = KernelImpl::kDispatch);

// k distinct indices, uniform over the k-subsets for a given seed (Floyd's algorithm on the
// counter-based generator), sorted, with their values. Not scaled: multiply by n / k for an
// unbiased estimate of x. ISA-independent (a bitmap of n bits and k draws).
void randomk(const float* x, std::size_t n, std::size_t k, std::uint64_t seed, std::uint32_t* idx,
             float* val);

// y[idx[i]] += val[i] for i = 0 .. m-1, in that order (float32 y of n elements). Every index is
// checked against n first (std::invalid_argument, y untouched).
void scatter_add(float* y, std::size_t n, const std::uint32_t* idx, const float* val, std::size_t m,
                 KernelImpl impl = KernelImpl::kDispatch);

}  // namespace zcoll::kernels
