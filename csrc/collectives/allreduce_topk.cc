// Top-k sparse allreduce, pipelined: blockwise top-k whose selection overlaps the exchange.
//
// Purpose:  send each rank's largest-magnitude elements. Top-k payloads cannot be summed by a
//           plain allreduce (indices differ per rank), so every rank gets every rank's pairs.
// Segments: S = topk_segments(count, exact) near-equal segments (compression.h: 8 from 512 KiB
//           to 32 MiB of float32, ~4 MiB each beyond, >= 64 KiB each; one for exact top-k and
//           below 128 KiB). Segment j keeps exactly k_j = sparse_k(len_j, ratio) pairs, so every
//           message size is known on every rank in advance: no header round, no receive of
//           unknown length. pairs = [rank 0: [idx k_0][val k_0] [idx k_1][val k_1] ...][rank 1 ...]
// Phases:   one engine schedule (TopkExchange below): message (j, d) carries segment j's pairs
//           to rank + d, straight into `pairs` on the receiver.
//           1. before segment j's first send: select it on float32 (2-byte inputs widened per
//              segment; error feedback fused: topk_ef, r = g + e, pick, e = r minus what was
//              picked) and make its indices global; its p-1 sends follow, so it is on the wire
//              while j+1 is selected (receives run `skew` messages behind the sends);
//           2. before segment j's first receive: zero its output (its input was consumed in 1,
//              so in == out is fine) while the data is on its way;
//           3. after its last receive: scatter-add the blocks in rank order 0..p-1 (the same
//              additions in the same order on every rank: identical bits), count the non-finite
//              values received (the same count everywhere), avg, cast to 2 bytes.
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



// The exchange: message m = (segment j, distance d) = j * per + (d - 1) carries segment j's
// pairs to rank + d (per = p - 1 messages per segment; one empty message per segment on one
// rank, so the selection still runs). Unit v sends message v and receives message v - skew,
// skew = min(per, 4 depth): the selection of segment j + 1 (before the first send of j + 1)
// runs while segment j is on the wire. (skew < 5 depth keeps the engine's bounded send window
// deadlock-free: a receive is always posted before a sender can block on it.)
class TopkExchange : public ScheduleBase {
 public:
  TopkExchange(Communicator& comm, const TopkLayout& L, const void* in, void* out, DType dtype,
               const CompressionOptions& o, float* residual, unsigned char* pairs, float* widened, float* y,
               std::vector<std::size_t>& bad)
      : L_(L), in_(static_cast<const unsigned char*>(in)), out_(static_cast<unsigned char*>(out)), dtype_(dtype),
        o_(o), e_(residual), pairs_(pairs), w_(widened), y_(y), bad_(bad), rank_(comm.rank()), p_(comm.size()),
        per_(static_cast<std::size_t>(std::max(1, p_ - 1))),
        skew_(std::min<std::size_t>(per_, 4 * static_cast<std::size_t>(pipeline_depth(o.pipeline)))) {}

  std::size_t num_units() const { return messages() + skew_; }
  std::size_t max_recv_bytes() const { return 0; }

  Unit unit(std::size_t v) const {
    Unit u;
    if (p_ == 1) return u;
    if (v < messages()) {
      const std::size_t j = v / per_;
      const int d = static_cast<int>(v % per_) + 1;
      u.send[0] = {idx_of(rank_, j), 8 * L_.k[j], mod(rank_ + d, p_)};
    }
    if (v >= skew_) {
      const std::size_t m = v - skew_, j = m / per_;
      const int src = mod(rank_ - static_cast<int>(m % per_) - 1, p_);
      u.recv[0] = {idx_of(src, j), 8 * L_.k[j], src};
    }
    return u;
  }

  // Select a segment before its first send; zero a segment's output before its first receive
  // (its input was consumed by its selection, so in == out is fine), while the data travels.
  void before_send(std::size_t v) {
    if (v < messages() && v % per_ == 0) select(v / per_);
    if (v >= skew_ && (v - skew_) % per_ == 0) {
      const std::size_t j = (v - skew_) / per_;
      std::memset(y_ + L_.begin[j], 0, L_.len(j) * sizeof(float));
    }
  }

  // After a segment's last receive: add every rank's pairs, in rank order.
  void on_received(std::size_t v, const Slots&) {
    if (v >= skew_ && (v - skew_) % per_ == per_ - 1) add((v - skew_) / per_);
  }

  // Top-k of segment j (error feedback fused), indices made global.
  void select(std::size_t j) {
    topk_select_segment(in_, dtype_, e_, L_, j, o_.seed, w_, idx_of(rank_, j), val_of(rank_, j));
  }

  std::uint32_t* idx_of(int r, std::size_t j) const {
    return reinterpret_cast<std::uint32_t*>(pairs_ + 8 * (r * L_.K + L_.koff[j]));
  }
  float* val_of(int r, std::size_t j) const { return reinterpret_cast<float*>(idx_of(r, j) + L_.k[j]); }

 private:
  std::size_t messages() const { return L_.segments() * per_; }

  void add(std::size_t j) {
    const std::size_t b = L_.begin[j], n = L_.len(j);
    for (int r = 0; r < p_; ++r) {
      kernels::scatter_add(y_, L_.begin.back(), idx_of(r, j), val_of(r, j), L_.k[j]);
      bad_[r] += count_nonfinite(val_of(r, j), L_.k[j]);
    }
    if (o_.op == ReduceOp::kAvg) kernels::divide(y_ + b, n, DType::kFloat32, p_);
    if (w_) kernels::cast(y_ + b, DType::kFloat32, out_ + b * dtype_size(dtype_), dtype_, n);
  }

  const TopkLayout& L_;
  const unsigned char* in_;
  unsigned char* out_;
  DType dtype_;
  const CompressionOptions& o_;
  float* e_;
  unsigned char* pairs_;
  float* w_;  // 2-byte inputs: a segment widened to float32, else null
  float* y_;  // the float32 result (out itself for float32)
  std::vector<std::size_t>& bad_;
  int rank_, p_;
  std::size_t per_, skew_;
};

// Dense fallback: own pairs scattered into zeros, the non-finite counts allgathered, a ring
// allreduce of the dense vectors.
void dense_fallback(Communicator& comm, TopkExchange& x, const TopkLayout& L, void* out, DType dtype,
                    const CompressionOptions& o, float* y, std::vector<std::size_t>& bad) {
  const int p = comm.size(), rank = comm.rank();
  const std::size_t count = L.begin.back();
  for (std::size_t j = 0; j < L.segments(); ++j) x.select(j);
  std::memset(y, 0, count * sizeof(float));
  for (std::size_t j = 0; j < L.segments(); ++j) {
    kernels::scatter_add(y, count, x.idx_of(rank, j), x.val_of(rank, j), L.k[j]);
    bad[rank] += count_nonfinite(x.val_of(rank, j), L.k[j]);
  }
  std::vector<long long> all(p);
  const long long mine = static_cast<long long>(bad[rank]);
  allgather(comm, &mine, all.data(), 1, DType::kInt64, CollectiveOptions{0, o.pipeline, false});
  for (int r = 0; r < p; ++r) bad[r] = static_cast<std::size_t>(all[r]);
  if (p > 1) allreduce_ring(comm, {y, y, count, DType::kFloat32, o.op, o.pipeline});  // divides for avg
  if (dtype != DType::kFloat32) kernels::cast(y, DType::kFloat32, out, dtype, count);
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
  // The segment samples its share of the whole tensor's sample (same pairs, less sampling).
  const std::size_t sample = kernels::topk_sample_share(L.begin.back(), n);
  const auto m = kernels::TopkMethod::kSampled;
  if (residual)
    kernels::topk_ef(g, residual + b, n, k, idx, val, m, seed, kernels::KernelImpl::kDispatch, sample);
  else
    kernels::topk(g, n, k, idx, val, m, seed, kernels::KernelImpl::kDispatch, sample);
  for (std::size_t i = 0; i < k; ++i) idx[i] += static_cast<std::uint32_t>(b);
}

void allreduce_topk(Communicator& comm, const void* in, void* out, std::size_t count, DType dtype,
                    const CompressionOptions& o, float* residual, CompressionStats& stats) {
  const int p = comm.size();
  const TopkLayout L(count, o);
  const bool wide = dtype != DType::kFloat32, dense = 2 * p * L.K > count;
  stats.pairs = p * L.K;
  auto* pairs = static_cast<unsigned char*>(comm.scratch(8 * L.K * p, Scratch::kPairs));
  float* w = wide ? static_cast<float*>(comm.scratch(L.longest * sizeof(float), Scratch::kWidened)) : nullptr;
  float* y = wide ? static_cast<float*>(comm.scratch(count * sizeof(float), Scratch::kWideResult))
                  : static_cast<float*>(out);
  std::vector<std::size_t> bad(p, 0);
  TopkExchange exchange(comm, L, in, out, dtype, o, residual, pairs, w, y, bad);
  if (dense) {
    stats.dense_fallback = true;
    dense_fallback(comm, exchange, L, out, dtype, o, y, bad);
  } else {
    run_pipeline(comm, exchange, o.pipeline, kTagSparsePairs);
  }
  for (int r = 0; r < p; ++r) {
    stats.nonfinite += bad[r];
    if (bad[r] && stats.first_nonfinite_rank < 0) stats.first_nonfinite_rank = r;
  }
}

}  // namespace zcoll::detail
