// Top-k sparse allreduce, pipelined: blockwise top-k whose selection overlaps the exchange.
//
// Purpose:  send each rank's largest-magnitude elements. Top-k payloads cannot be summed by a
//           plain allreduce (indices differ per rank), so every rank gets every rank's pairs.
// Segments: S = topk_segments(count, exact) near-equal segments (compression.h: 8 from 512 KiB
//           to 32 MiB of float32, ~4 MiB each beyond, >= 64 KiB each; one for exact top-k and
//           below 128 KiB). Segment j keeps exactly k_j = sparse_k(len_j, ratio) pairs, so every
//           message size is known on every rank in advance: no header round, no receive of
//           unknown length. pairs = [rank 0: [idx k_0][val k_0] [idx k_1][val k_1] ...][rank 1 ...]
// Phases:   0. post the receives of every (segment, peer) block straight into `pairs`.
//           1. for j = 0 .. S-1: select segment j on float32 (2-byte inputs widened per segment;
//              error feedback fused: topk_ef, r = g + e, pick, e = r minus what was picked), make
//              its indices global, send the block to every peer (rank+1, rank+2, ...), so it is
//              on the wire while j+1 is selected; then test the oldest unfinished segment and
//              finish it (as in 2) if every block of it has arrived. The tests also let MPI,
//              which has no progress thread over TCP, move the messages in flight.
//           2. for each unfinished segment: zero its output (its input was consumed in 1, so
//              in == out is fine) while the data is on its way, wait, scatter-add the blocks in
//              rank order 0..p-1 (the same additions in the same order on every rank: identical
//              bits), count the non-finite values received (the same count everywhere), avg,
//              cast to 2 bytes.
//           Dense fallback (rule: p K > count / 2, K = SUM k_j, known before selecting): own
//           pairs scattered into zeros, an int64 allgather of the non-finite counts, a ring
//           allreduce: above count / 2 pairs it sends as few bytes and is cheaper to apply.
// Cost:     (p-1) S alpha (overlapped) + (p-1) 8K beta per rank (what a ring allgather sends,
//           but sent directly: no rank waits for another to forward). Exposed compute: the
//           selection of segment 0 and the addition of the last; the rest of the selection
//           (one read of the input) and the zeroing hide behind the transfer while the link
//           is the slower of the two.
#include <algorithm>
#include <cstring>
#include <vector>

#include "collectives/algorithms.h"
#include "collectives/compressed.h"
#include "collectives/pipeline.h"
#include "kernels/quantize.h"
#include "kernels/reduce.h"
#include "kernels/sparsify.h"

namespace zcoll::detail {
namespace {

std::size_t count_nonfinite(const float* v, std::size_t m) {
  std::size_t bad = 0;
  for (std::size_t i = 0; i < m; ++i) bad += !(v[i] - v[i] == 0.0f);
  return bad;
}

}  // namespace

TopkLayout::TopkLayout(std::size_t count, const CompressionOptions& o) {
  const std::size_t s = topk_segments(count, o.exact_topk);
  for (std::size_t j = 0; j < s; ++j) {
    const Range seg = split(Range{0, count}, s, j);
    begin.push_back(seg.begin);
    k.push_back(sparse_k(seg.count, o.ratio));
    koff.push_back(K);
    K += k.back();
    longest = std::max(longest, seg.count);
  }
  begin.push_back(count);
}

void topk_select_segment(const void* in, DType dtype, float* residual, const TopkLayout& L, std::size_t j,
                         std::uint64_t seed, float* w, std::uint32_t* idx, float* val) {
  const std::size_t b = L.begin[j], n = L.len(j), k = L.k[j];
  const float* g = static_cast<const float*>(in) + b;
  if (dtype != DType::kFloat32) {
    kernels::cast(static_cast<const unsigned char*>(in) + b * dtype_size(dtype), dtype, w, DType::kFloat32, n);
    g = w;
  }
  if (residual)
    kernels::topk_ef(g, residual + b, n, k, idx, val, kernels::TopkMethod::kSampled, seed);
  else
    kernels::topk(g, n, k, idx, val, kernels::TopkMethod::kSampled, seed);
  for (std::size_t i = 0; i < k; ++i) idx[i] += static_cast<std::uint32_t>(b);
}

void allreduce_topk(Communicator& comm, const void* in, void* out, std::size_t count, DType dtype,
                    const CompressionOptions& o, float* residual, CompressionStats& stats) {
  const int p = comm.size(), rank = comm.rank();
  const TopkLayout L(count, o);
  const std::size_t S = L.segments(), K = L.K, es = dtype_size(dtype);
  const bool wide = dtype != DType::kFloat32, dense = 2 * p * K > count;
  stats.pairs = p * K;
  auto* pairs = static_cast<unsigned char*>(comm.scratch(8 * K * p, 7));
  auto idx_of = [&](int r, std::size_t j) {
    return reinterpret_cast<std::uint32_t*>(pairs + 8 * (r * K + L.koff[j]));
  };
  auto val_of = [&](int r, std::size_t j) { return reinterpret_cast<float*>(idx_of(r, j) + L.k[j]); };
  float* w = wide ? static_cast<float*>(comm.scratch(L.longest * sizeof(float), 4)) : nullptr;
  float* y = wide ? static_cast<float*>(comm.scratch(count * sizeof(float), 6)) : static_cast<float*>(out);

  // 0. receives, (segment, distance) order
  std::vector<Request> recvs, sends;
  if (!dense)
    for (std::size_t j = 0; j < S; ++j)
      for (int d = 1; d < p; ++d) {
        const int src = mod(rank - d, p);
        recvs.push_back(comm.irecv(idx_of(src, j), 8 * L.k[j], src, kTagSparsePairs));
      }
  std::vector<std::size_t> bad(p, 0);
  auto arrived = [&](std::size_t j, bool block) {  // segment j from every peer
    for (int d = 1; d < p; ++d) {
      Request& r = recvs[j * (p - 1) + (d - 1)];
      if (block)
        comm.wait(r);
      else if (!comm.test(r))
        return false;
    }
    return true;
  };
  auto zero = [&](std::size_t j) { std::memset(y + L.begin[j], 0, L.len(j) * sizeof(float)); };
  auto add = [&](std::size_t j) {  // in rank order
    const std::size_t b = L.begin[j], n = L.len(j);
    for (int r = 0; r < p; ++r) {
      kernels::scatter_add(y, count, idx_of(r, j), val_of(r, j), L.k[j]);
      bad[r] += count_nonfinite(val_of(r, j), L.k[j]);
    }
    if (o.op == ReduceOp::kAvg) kernels::divide(y + b, n, DType::kFloat32, p);
    if (wide) kernels::cast(y + b, DType::kFloat32, static_cast<unsigned char*>(out) + b * es, dtype, n);
  };

  // 1. select segment j, send it; add the segments that have arrived meanwhile (the tests also
  //    let MPI move the messages in flight)
  std::size_t next = 0;  // the first segment not yet added
  for (std::size_t j = 0; j < S; ++j) {
    const std::size_t k = L.k[j];
    std::uint32_t* idx = idx_of(rank, j);
    topk_select_segment(in, dtype, residual, L, j, o.seed, w, idx, val_of(rank, j));
    if (dense) continue;
    for (int d = 1; d < p; ++d) sends.push_back(comm.isend(idx, 8 * k, mod(rank + d, p), kTagSparsePairs));
    while (next <= j && arrived(next, false)) {
      zero(next);
      add(next++);
    }
  }

  if (dense) {
    stats.dense_fallback = true;
    std::memset(y, 0, count * sizeof(float));
    for (std::size_t j = 0; j < S; ++j) {
      kernels::scatter_add(y, count, idx_of(rank, j), val_of(rank, j), L.k[j]);
      bad[rank] += count_nonfinite(val_of(rank, j), L.k[j]);
    }
    std::vector<long long> all(p);
    const long long mine = static_cast<long long>(bad[rank]);
    allgather(comm, &mine, all.data(), 1, DType::kInt64, CollectiveOptions{0, o.pipeline, false});
    for (int r = 0; r < p; ++r) bad[r] = static_cast<std::size_t>(all[r]);
    if (p > 1) allreduce_ring(comm, y, y, count, DType::kFloat32, o.op, o.pipeline);  // divides for avg
    if (wide) kernels::cast(y, DType::kFloat32, out, dtype, count);
  } else {
    // 2. the remaining segments: zero (while the data is on its way), wait, add
    for (; next < S; ++next) {
      zero(next);
      arrived(next, true);
      add(next);
    }
    comm.wait_all(sends);
  }
  for (int r = 0; r < p; ++r) {
    stats.nonfinite += bad[r];
    if (bad[r] && stats.first_nonfinite_rank < 0) stats.first_nonfinite_rank = r;
  }
}

}  // namespace zcoll::detail
