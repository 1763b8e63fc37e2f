// Sparse allreduce: threshold and random-k (top-k: allreduce_topk.cc).
//
// Purpose: send only the selected elements. Threshold payloads cannot be summed by a plain
//          allreduce (indices differ per rank), so they travel by allgather.
// Phases:  1. select, on float32 (2-byte inputs are widened first), with error feedback:
//             e += g, pick from e, zero e at the picked indices.
//          2. header: allgather of {pairs, non-finite selected values} per rank, so every rank
//             knows every count (and raises alike on NaN / Inf).
//          3a. random-k: every rank picked the same indices (same seed), so only the k values
//             travel: ring allreduce of k floats, then scattered into a zeroed output.
//          3b. threshold, sparse: ring allgatherv of every rank's block
//             [uint32 index x m][float32 value x m]; the output is zeroed and the blocks are
//             scatter-added in rank order 0..p-1: the same additions in the same order on
//             every rank, so bitwise identical results.
//          3c. threshold, dense (rule: total pairs T > count / 2): each rank scatters its pairs
//             into a zeroed float32 vector and a ring allreduce sums those. The pair exchange
//             would send 8 T (p-1)/p bytes per rank against 8 count (p-1)/p for the dense
//             ring, and each pair costs a random-access add: above count / 2 pairs the dense
//             ring is as cheap on the wire and cheaper to apply.
//          4. avg divides by p; 2-byte outputs are rounded from the float32 result.
// Why not pipelined like top-k: a threshold's pair counts depend on the data, so a receiver
//          cannot size a segment's message (nor the dense switch be agreed) before the header
//          round; its selection is one compaction pass, cheaper than top-k's.
// Cost:    header (p-1) alpha; sparse: (p-1) alpha + (T - m_{r+1}) 8 beta; random-k:
//          2(p-1) alpha + 2(p-1)/p 4k beta; dense: the ring's 2(p-1)/p 4 count beta.
//          Selection: one read of the input (threshold) or k draws (random-k).
// Error:   an element differs from the exact sum by what the ranks left unsent (compression.h).
#include <cstring>
#include <vector>

#include "collectives/algorithms.h"
#include "collectives/compressed.h"
#include "common/check.h"
#include "kernels/quantize.h"
#include "kernels/reduce.h"
#include "kernels/sparsify.h"

namespace zcoll::detail {
namespace {

bool finite(float v) { return v - v == 0.0f; }

std::uint32_t abs_bits(float v) {
  std::uint32_t u;
  std::memcpy(&u, &v, 4);
  return u & 0x7fffffffu;
}

std::size_t count_nonfinite(const float* v, std::size_t m) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < m; ++i) bad += !finite(v[i]);
  return bad;
}

void zero_at(float* e, const std::uint32_t* idx, std::size_t m) {
  for (std::size_t j = 0; j < m; ++j) e[idx[j]] = 0.0f;
}

// y = src where |src| > t else 0; e = 0 where picked (e may be src itself).
std::size_t dense_from_mask(const float* src, float t, float* e, std::size_t n, float* y) {
  const std::uint32_t tb = abs_bits(t);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const float v = src[i];
    const bool picked = abs_bits(v) > tb;
    bad += picked && !finite(v);
    y[i] = picked ? v : 0.0f;
    if (e && picked) e[i] = 0.0f;
  }
  return bad;
}

}  // namespace

SparseSelection select_sparse(const float* g, std::size_t n, const CompressionOptions& o, float* e,
                              std::size_t capacity, std::uint32_t* idx, float* val) {
  SparseSelection s;
  s.src = g;
  if (e) {
    kernels::reduce(e, e, g, n, DType::kFloat32, ReduceOp::kSum);
    s.src = e;
  }
  if (o.kind == Compression::kThreshold) {
    s.m = kernels::threshold(s.src, n, o.threshold, idx, val, capacity);
    s.overflow = s.m > capacity;
  } else {
    s.m = sparse_k(n, o.ratio);
    ZCOLL_REQUIRE(s.m <= capacity, "random-k: capacity ", capacity, " below k = ", s.m);
    kernels::randomk(s.src, n, s.m, o.seed, idx, val);
  }
  if (e && !s.overflow) zero_at(e, idx, s.m);
  return s;
}

void allreduce_sparse(Communicator& comm, const void* in, void* out, std::size_t count, DType dtype,
                      const CompressionOptions& o, float* residual, CompressionStats& stats) {
  const int p = comm.size(), rank = comm.rank();
  const std::size_t n = count;
  // 1. select
  const float* g = static_cast<const float*>(in);
  if (dtype != DType::kFloat32) {
    float* w = static_cast<float*>(comm.scratch(n * sizeof(float), Scratch::kWidened));
    kernels::cast(in, dtype, w, DType::kFloat32, n);
    g = w;
  }
  const std::size_t capacity = o.kind == Compression::kThreshold ? n / 2 + 1 : sparse_k(n, o.ratio);
  auto* buf = static_cast<unsigned char*>(comm.scratch(capacity * 8, Scratch::kSelection));
  auto* sel_idx = reinterpret_cast<std::uint32_t*>(buf);
  auto* sel_val = reinterpret_cast<float*>(buf + capacity * 4);
  const SparseSelection s = select_sparse(g, n, o, residual, capacity, sel_idx, sel_val);
  float* y = dtype == DType::kFloat32 ? static_cast<float*>(out)
                                      : static_cast<float*>(comm.scratch(n * sizeof(float), Scratch::kWideResult));
  std::size_t bad = 0;
  if (s.overflow)  // y may alias the input: the selection is done, the input no longer needed
    bad = dense_from_mask(s.src, o.threshold, residual, n, y);
  else
    bad = count_nonfinite(sel_val, s.m);

  // 2. header
  std::vector<long long> header(2 * static_cast<std::size_t>(p));
  const long long mine[2] = {static_cast<long long>(s.m), static_cast<long long>(bad)};
  allgather(comm, mine, header.data(), 2, DType::kInt64, CollectiveOptions{0, o.pipeline, false});
  std::vector<std::size_t> m(p), offset(p), bytes(p);
  std::size_t total = 0;
  for (int r = 0; r < p; ++r) {
    m[r] = static_cast<std::size_t>(header[2 * r]);
    offset[r] = 8 * total;
    bytes[r] = 8 * m[r];
    total += m[r];
    stats.nonfinite += static_cast<std::uint64_t>(header[2 * r + 1]);
    if (header[2 * r + 1] && stats.first_nonfinite_rank < 0) stats.first_nonfinite_rank = r;
  }
  stats.pairs = total;

  if (o.kind == Compression::kRandomK) {  // 3a. same indices everywhere: sum the values
    if (p > 1) allreduce_ring(comm, {sel_val, sel_val, s.m, DType::kFloat32, o.op, o.pipeline});
    std::memset(y, 0, n * sizeof(float));
    kernels::scatter_add(y, n, sel_idx, sel_val, s.m);
  } else if (2 * total > n) {  // 3c. dense
    stats.dense_fallback = true;
    if (!s.overflow) {
      std::memset(y, 0, n * sizeof(float));
      kernels::scatter_add(y, n, sel_idx, sel_val, s.m);
    }
    if (p > 1) allreduce_ring(comm, {y, y, n, DType::kFloat32, o.op, o.pipeline});
  } else {  // 3b. sparse
    auto* pairs = static_cast<unsigned char*>(comm.scratch(8 * total, Scratch::kPairs));
    std::memcpy(pairs + offset[rank], sel_idx, 4 * s.m);
    std::memcpy(pairs + offset[rank] + 4 * s.m, sel_val, 4 * s.m);
    ring_allgatherv(comm, pairs, offset.data(), bytes.data(), o.pipeline);
    std::memset(y, 0, n * sizeof(float));
    for (int r = 0; r < p; ++r)
      kernels::scatter_add(y, n, reinterpret_cast<const std::uint32_t*>(pairs + offset[r]),
                           reinterpret_cast<const float*>(pairs + offset[r] + 4 * m[r]), m[r]);
    if (o.op == ReduceOp::kAvg) kernels::divide(y, n, DType::kFloat32, p);
  }
  // 4. (the rings of 3a and 3c divide for avg themselves)
  if (dtype != DType::kFloat32) kernels::cast(y, DType::kFloat32, out, dtype, n);
}

}  // namespace zcoll::detail
