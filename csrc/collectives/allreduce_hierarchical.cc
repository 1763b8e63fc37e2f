// Hierarchical allreduce: node-local reduce-scatter, an inter-node ring allreduce of each shard
// among the ranks with the same local index, node-local allgather, pipelined in one schedule.
//
// Purpose: ranks spread over N nodes of L ranks each, where the links between nodes are the slow
//          ones. A flat ring sends 2(p-1)/p S over each of its hops, the two that cross nodes
//          included; here only the inter-node stage crosses, and each of a node's L ranks sends
//          2(N-1)/N S/L across: the node's link carries 2(N-1)/N S instead of 2(p-1)/p S
//          (2 nodes x 2 ranks: S instead of 1.5 S), optionally compressed (int8: about S/4).
// Layout:  rank (n, l) is the l-th rank of node n (NodeGrid, hierarchy.h). The buffer is cut into
//          blocks, block b into L shards (shard l is what ranks (., l) reduce across nodes), each
//          shard into N chunks (HierLayout); one chunk, one inter-node message, is at most a
//          segment (max_segment_bytes; of float32 input when compressed).
// Phases, per block b:
//          1. intra reduce-scatter: a ring over the node's L ranks, L-1 steps (the ring's
//             reduce-scatter with shift -1, so rank (n, l) ends with shard l): step 0 sends from
//             `in`, each step writes OP(incoming, in) into `out`;
//          2. inter allreduce of shard l: a ring over ranks (0..N-1, l), node n at position n,
//             N-1 reduce-scatter steps (OP(incoming, mine) into `out`; the owner of a chunk
//             divides by p for avg) and N-1 allgather steps straight into `out`. Compressed
//             (allreduce_hierarchical_compressed): the compressed ring's payloads (RingCodec)
//             instead, every final payload decoded into `out`;
//          3. intra allgather: a ring over the node, L-1 steps, every shard of block b into `out`.
// Pipeline: units come in groups of K = max(2(L-1), 2(N-1)). Group g carries phase 1 of block g
//          and phase 3 of block g-2 on its intra-node lane, phase 2 of block g-1 on its
//          inter-node lane, one message per lane per unit (a unit's two peers: one on the node,
//          one on another node). So the node-local stages of the neighbouring blocks run while
//          a block crosses the slow links, and every dependency points to an earlier group.
// Unequal nodes: L is the smallest node's size; the other ranks ("extras", NodeGrid) send their
//          input to a rank of the grid on their node before the phases (FoldExtras, added in
//          ascending rank order) and receive the result after them; the grid alone runs 1-3.
//          Dense only: the compressed stage needs equal nodes.
// Identical bits: each element's final value is computed once, by the owner of its chunk in the
//          inter-node ring (its decode, when compressed), and copied everywhere else.
// Cost:    inter-node 2(N-1) alpha + 2(N-1)/N (S/L) beta per rank (L ranks share a node's link);
//          node-local 2(L-1) alpha_node + 2(L-1)/L S beta_node; (L-1)/L S + (N-1)/(N L) S
//          reduced per rank. Pipelined, the time is about the slower of the two stages plus one
//          block of the other: 2(p-1) messages' latency at most, against 2(p-1) for the ring.
//          The table's model (allreduce_hierarchical_cost: one alpha, beta and gamma for both
//          levels, L = p / N) adds the two stages, an upper bound.
#include <cstring>
#include <memory>

#include "collectives/algorithms.h"
#include "collectives/compressed.h"
#include "collectives/hierarchy.h"
#include "common/check.h"
#include "kernels/quantize.h"
#include "kernels/reduce.h"

namespace zcoll {
namespace detail {
namespace {

constexpr std::size_t kAlign = 64;

// Phase 2 on the data itself. Message m of a block: m < N-1 reduce-scatter step m, else
// allgather step m-(N-1). `x` is this rank's contribution to its shard: `out` (the node's sum,
// from phase 1) when L > 1, `in` when it is alone on its node.
class DenseInter {
 public:
  DenseInter(const HierLayout& layout, const NodeGrid& grid, const void* x, void* out, DType dtype, ReduceOp op,
             int p)
      : layout_(layout), grid_(grid), x_(static_cast<const unsigned char*>(x)),
        out_(static_cast<unsigned char*>(out)), es_(dtype_size(dtype)), dtype_(dtype), op_(op), p_(p) {}

  std::size_t max_recv_bytes() const { return layout_.max_chunk_elems() * es_; }

  Transfer send(std::size_t b, int m) const {
    const int n = grid_.node(), N = grid_.nodes();
    const bool reducing = m < N - 1;
    const Range c = chunk(b, reducing ? n - m : n - (m - (N - 1)) + 1);
    const unsigned char* base = reducing && m == 0 ? x_ : out_;
    return Transfer{base + c.begin * es_, c.count * es_, grid_.rank(n + 1, grid_.local())};
  }
  Transfer recv(std::size_t b, int m) const {
    const int n = grid_.node(), N = grid_.nodes();
    const bool reducing = m < N - 1;
    const Range c = chunk(b, reducing ? n - m - 1 : n - (m - (N - 1)));
    return Transfer{reducing ? nullptr : out_ + c.begin * es_, c.count * es_, grid_.rank(n - 1, grid_.local())};
  }
  void before_send(std::size_t, int) {}
  void on_received(std::size_t b, int m, const void* data) {
    const int N = grid_.nodes();
    if (m >= N - 1 || !data) return;
    const Range c = chunk(b, grid_.node() - m - 1);
    kernels::reduce(out_ + c.begin * es_, data, x_ + c.begin * es_, c.count, dtype_, op_);
    if (m == N - 2 && op_ == ReduceOp::kAvg) kernels::divide(out_ + c.begin * es_, c.count, dtype_, p_);
  }

 private:
  Range chunk(std::size_t b, int k) const { return layout_.chunk(b, grid_.local(), k); }

  const HierLayout& layout_;
  const NodeGrid& grid_;
  const unsigned char* x_;
  unsigned char* out_;
  std::size_t es_;
  DType dtype_;
  ReduceOp op_;
  int p_;
};

// Phase 2 on compressed payloads, as the compressed ring does it (allreduce_compressed_ring.cc):
// reduce-scatter step 0 encodes this rank's chunk (hop 0), step s combines D(in) + x -> Q (hop
// s+1), the last one's result is final: decoded here and forwarded unchanged by the allgather
// steps, whose every payload is decoded too. Error feedback as there, on `x` (the node's sum).
class CodedInter {
 public:
  CodedInter(Communicator& comm, const HierLayout& layout, const NodeGrid& grid, const void* x, void* out,
             DType dtype, const CompressionOptions& o, float* residual, std::size_t max_segment)
      : layout_(layout), grid_(grid), x_(static_cast<const unsigned char*>(x)),
        out_(static_cast<unsigned char*>(out)), e_(residual), es_(dtype_size(dtype)),
        divisor_(o.op == ReduceOp::kAvg ? comm.size() : 1) {
    codec_ = make_ring_codec(
        o, dtype, static_cast<float*>(comm.scratch(2 * max_segment * sizeof(float), Scratch::kCodecFloats)),
        max_segment);
    stride_ = (codec_->payload_bytes(layout.max_chunk_elems()) + kAlign - 1) / kAlign * kAlign;
    const std::size_t area = layout.blocks() * static_cast<std::size_t>(grid.nodes()) * stride_;
    rs_area_ = static_cast<unsigned char*>(comm.scratch(2 * area, Scratch::kCompressedPayloads));
    ag_area_ = rs_area_ + area;
  }

  std::size_t max_recv_bytes() const { return stride_; }
  std::size_t nonfinite() const { return nonfinite_; }

  Transfer send(std::size_t b, int m) const {
    const int n = grid_.node(), N = grid_.nodes();
    const bool reducing = m < N - 1;
    const int k = reducing ? n - m : n - (m - (N - 1)) + 1;
    return Transfer{reducing ? rs(b, k) : ag(b, k), bytes(b, k), grid_.rank(n + 1, grid_.local())};
  }
  Transfer recv(std::size_t b, int m) const {
    const int n = grid_.node(), N = grid_.nodes();
    const int k = m < N - 1 ? n - m - 1 : n - (m - (N - 1));
    return Transfer{nullptr, bytes(b, k), grid_.rank(n - 1, grid_.local())};
  }
  void before_send(std::size_t b, int m) {
    if (m != 0) return;
    const Range c = chunk(b, grid_.node());
    if (c.count) codec_->encode(x(c), e(c), c.begin, c.count, 0, rs(b, grid_.node()));
  }
  void on_received(std::size_t b, int m, const void* data) {
    if (!data) return;
    const int n = grid_.node(), N = grid_.nodes();
    if (m < N - 1) {
      const int k = n - m - 1;
      const Range c = chunk(b, k);
      const bool last = m == N - 2;
      void* dst = last ? ag(b, k) : rs(b, k);
      codec_->combine(data, x(c), e(c), c.begin, c.count, m + 1, dst);
      if (last) nonfinite_ += codec_->decode(dst, c.count, divisor_, y(c));
      return;
    }
    const int s = m - (N - 1), k = n - s;
    const Range c = chunk(b, k);
    if (s < N - 2) std::memcpy(ag(b, k), data, bytes(b, k));  // forwarded at the next step
    nonfinite_ += codec_->decode(data, c.count, divisor_, y(c));
  }

 private:
  Range chunk(std::size_t b, int k) const { return layout_.chunk(b, grid_.local(), k); }
  std::size_t bytes(std::size_t b, int k) const {
    const std::size_t n = chunk(b, k).count;
    return n ? codec_->payload_bytes(n) : 0;
  }
  std::size_t slot(std::size_t b, int k) const {
    return (b * static_cast<std::size_t>(grid_.nodes()) + static_cast<std::size_t>(mod(k, grid_.nodes()))) * stride_;
  }
  unsigned char* rs(std::size_t b, int k) const { return rs_area_ + slot(b, k); }
  unsigned char* ag(std::size_t b, int k) const { return ag_area_ + slot(b, k); }
  const void* x(Range c) const { return x_ + c.begin * es_; }
  void* y(Range c) const { return out_ + c.begin * es_; }
  float* e(Range c) const { return e_ ? e_ + c.begin : nullptr; }

  const HierLayout& layout_;
  const NodeGrid& grid_;
  const unsigned char* x_;
  unsigned char* out_;
  float* e_;
  std::size_t es_;
  int divisor_;
  std::unique_ptr<RingCodec> codec_;
  std::size_t stride_ = 0;
  unsigned char* rs_area_ = nullptr;
  unsigned char* ag_area_ = nullptr;
  std::size_t nonfinite_ = 0;
};

template <typename Inter>
class Hierarchical : public ScheduleBase {
 public:
  Hierarchical(const NodeGrid& grid, const HierLayout& layout, const void* in, void* out, DType dtype, ReduceOp op,
               int p, Inter& inter)
      : grid_(grid), layout_(layout), in_(static_cast<const unsigned char*>(in)),
        out_(static_cast<unsigned char*>(out)), es_(dtype_size(dtype)), dtype_(dtype), op_(op), p_(p),
        intra_(grid.local_size() - 1), inter_msgs_(2 * (grid.nodes() - 1)),
        group_(std::max(2 * intra_, inter_msgs_)), inter_(inter) {}

  std::size_t num_units() const { return (layout_.blocks() + 2) * static_cast<std::size_t>(group_); }
  std::size_t max_recv_bytes() const {
    return std::max(intra_ ? layout_.max_shard_elems() * es_ : 0, inter_.max_recv_bytes());
  }

  Unit unit(std::size_t u) const {
    Unit unit;
    const Where w = where(u);
    if (w.intra_step >= 0) {
      const int l = grid_.local(), s = w.intra_step;
      const Range send = shard(w.intra_block, w.reducing ? l - s - 1 : l - s);
      const Range recv = shard(w.intra_block, w.reducing ? l - s - 2 : l - s - 1);
      const unsigned char* base = w.reducing && s == 0 ? in_ : out_;
      unit.send[0] = {base + send.begin * es_, send.count * es_, grid_.rank(grid_.node(), l + 1)};
      unit.recv[0] = {w.reducing ? nullptr : out_ + recv.begin * es_, recv.count * es_,
                      grid_.rank(grid_.node(), l - 1)};
    }
    if (w.inter_msg >= 0) {
      unit.send[1] = inter_.send(w.inter_block, w.inter_msg);
      unit.recv[1] = inter_.recv(w.inter_block, w.inter_msg);
    }
    return unit;
  }
  void before_send(std::size_t u) {
    const Where w = where(u);
    if (w.inter_msg >= 0) inter_.before_send(w.inter_block, w.inter_msg);
  }
  void on_received(std::size_t u, const Slots& slots) {
    const Where w = where(u);
    if (w.intra_step >= 0 && w.reducing && slots.data[0]) {
      const int s = w.intra_step;
      const Range c = shard(w.intra_block, grid_.local() - s - 2);
      kernels::reduce(out_ + c.begin * es_, slots.data[0], in_ + c.begin * es_, c.count, dtype_, op_);
      // One node: this step ends the reduction (with several, the inter-node owner divides).
      if (s == intra_ - 1 && grid_.nodes() == 1 && op_ == ReduceOp::kAvg)
        kernels::divide(out_ + c.begin * es_, c.count, dtype_, p_);
    }
    if (w.inter_msg >= 0) inter_.on_received(w.inter_block, w.inter_msg, slots.data[1]);
  }

 private:
  // What unit u carries: the intra-node message (reduce-scatter step of block g, or allgather
  // step of block g-2; intra_step -1: none) and the inter-node message of block g-1 (-1: none).
  struct Where {
    std::size_t intra_block = 0, inter_block = 0;
    int intra_step = -1, inter_msg = -1;
    bool reducing = false;
  };
  Where where(std::size_t u) const {
    Where w;
    const std::size_t g = u / static_cast<std::size_t>(group_), nblk = layout_.blocks();
    const int i = static_cast<int>(u % static_cast<std::size_t>(group_));
    if (i < intra_ && g < nblk) {
      w.intra_block = g, w.intra_step = i, w.reducing = true;
    } else if (i >= intra_ && i < 2 * intra_ && g >= 2 && g - 2 < nblk) {
      w.intra_block = g - 2, w.intra_step = i - intra_;
    }
    if (i < inter_msgs_ && g >= 1 && g - 1 < nblk) w.inter_block = g - 1, w.inter_msg = i;
    return w;
  }
  Range shard(std::size_t b, int l) const { return layout_.shard(b, l); }

  const NodeGrid& grid_;
  const HierLayout& layout_;
  const unsigned char* in_;
  unsigned char* out_;
  std::size_t es_;
  DType dtype_;
  ReduceOp op_;
  int p_, intra_, inter_msgs_, group_;
  Inter& inter_;
};

// The sum of one counter over the ranks of this rank's node: each sends its value to every other
// (L-1 units), so every rank of the node ends with the same total.
class NodeSum : public ScheduleBase {
 public:
  NodeSum(const NodeGrid& grid, std::uint64_t mine) : grid_(grid), mine_(mine), total_(mine) {}
  std::size_t num_units() const { return static_cast<std::size_t>(grid_.local_size() - 1); }
  std::size_t max_recv_bytes() const { return sizeof(std::uint64_t); }
  Unit unit(std::size_t u) const {
    const int k = static_cast<int>(u) + 1, l = grid_.local(), n = grid_.node();
    return Unit::exchange(&mine_, sizeof mine_, grid_.rank(n, l + k), nullptr, sizeof mine_, grid_.rank(n, l - k));
  }
  void on_received(std::size_t, const Slots& slots) {
    std::uint64_t v;
    std::memcpy(&v, slots.data[0], sizeof v);
    total_ += v;
  }
  std::uint64_t total() const { return total_; }

 private:
  const NodeGrid& grid_;
  std::uint64_t mine_, total_;
};

// Nodes of different sizes (NodeGrid): gather == true: each extra sends its input to its core
// rank, which adds its extras' inputs, in ascending rank order, to its own into `out`;
// gather == false: each core rank sends the result to its extras. Every message is at most a
// segment. Cost per core rank with k extras: k (alpha + S beta_node) each way.
class FoldExtras : public ScheduleBase {
 public:
  FoldExtras(const NodeGrid& grid, const void* in, void* out, std::size_t count, DType dtype, ReduceOp op,
             bool gather, const PipelineOptions& o)
      : grid_(grid), in_(static_cast<const unsigned char*>(in)), out_(static_cast<unsigned char*>(out)),
        count_(count), es_(dtype_size(dtype)), dtype_(dtype), op_(op), gather_(gather),
        nseg_(num_segments(count, es_, o)) {}

  std::size_t num_units() const { return nseg_ * (grid_.core() ? grid_.extras().size() : 1); }
  std::size_t max_recv_bytes() const { return (count_ + nseg_ - 1) / nseg_ * es_; }
  Unit unit(std::size_t u) const {
    const Range r = segment(u);
    const std::size_t bytes = r.count * es_;
    Unit unit;
    if (grid_.core()) {
      const int extra = grid_.extras()[u / nseg_];
      if (gather_)
        unit.recv[0] = {nullptr, bytes, extra};
      else
        unit.send[0] = {out_ + r.begin * es_, bytes, extra};
    } else if (gather_) {
      unit.send[0] = {in_ + r.begin * es_, bytes, grid_.partner()};
    } else {
      unit.recv[0] = {out_ + r.begin * es_, bytes, grid_.partner()};
    }
    return unit;
  }
  void on_received(std::size_t u, const Slots& slots) {
    if (!gather_ || !grid_.core() || !slots.data[0]) return;
    const Range r = segment(u);
    const unsigned char* acc = u < nseg_ ? in_ : out_;  // the first extra adds to the input
    kernels::reduce(out_ + r.begin * es_, acc + r.begin * es_, slots.data[0], r.count, dtype_, op_);
  }

 private:
  Range segment(std::size_t u) const { return split(Range{0, count_}, nseg_, u % nseg_); }

  const NodeGrid& grid_;
  const unsigned char* in_;
  unsigned char* out_;
  std::size_t count_, es_;
  DType dtype_;
  ReduceOp op_;
  bool gather_;
  std::size_t nseg_;
};

// With a residual, this rank's contribution outside its own shards (which its codec never
// quantizes, so never adds the residual to) is in + e, folded here once per call into a copy of
// the input; e keeps what rounding that sum to dtype loses (nothing for float32, whose sum is
// rounded as the codecs round x + e). So every element of e is used and rewritten once per call,
// as in the compressed ring, whatever algorithm the previous call ran.
const void* fold_residual(Communicator& comm, const HierLayout& layout, int local, int L, const void* in,
                          std::size_t count, DType dtype, float* e, float* tmp, std::size_t tmp_elems) {
  const std::size_t es = dtype_size(dtype);
  auto* x = static_cast<unsigned char*>(comm.scratch(count * es, Scratch::kHierarchicalInput));
  const auto* src = static_cast<const unsigned char*>(in);
  const std::size_t piece = tmp_elems / 2;
  float* wide = tmp;
  float* back = tmp + piece;
  for (std::size_t b = 0; b < layout.blocks(); ++b)
    for (int l = 0; l < L; ++l) {
      const Range r = layout.shard(b, l);
      if (l == local) {
        std::memcpy(x + r.begin * es, src + r.begin * es, r.count * es);
        continue;
      }
      for (std::size_t i = r.begin; i < r.begin + r.count; i += piece) {
        const std::size_t n = std::min(piece, r.begin + r.count - i);
        if (dtype == DType::kFloat32) {
          kernels::reduce(x + i * es, src + i * es, e + i, n, DType::kFloat32, ReduceOp::kSum);
          std::memset(e + i, 0, n * sizeof(float));
          continue;
        }
        kernels::cast(src + i * es, dtype, wide, DType::kFloat32, n);
        kernels::reduce(wide, wide, e + i, n, DType::kFloat32, ReduceOp::kSum);
        kernels::cast(wide, DType::kFloat32, x + i * es, dtype, n);
        kernels::cast(x + i * es, dtype, back, DType::kFloat32, n);
        for (std::size_t j = 0; j < n; ++j) e[i + j] = wide[j] - back[j];
      }
    }
  return x;
}

std::size_t segment_elements(const PipelineOptions& pipeline, std::size_t es) {
  const std::size_t bytes = pipeline.max_segment_bytes ? pipeline.max_segment_bytes : default_segment_bytes();
  return std::max<std::size_t>(1, bytes / es);
}

}  // namespace

std::size_t allreduce_hierarchical_compressed(Communicator& comm, const void* in, void* out, std::size_t count,
                                              DType dtype, const CompressionOptions& o, float* residual) {
  ZCOLL_CHECK_LT(0, comm.ranks_per_node(), "hierarchical: nodes of unequal size (allreduce_compressed checks)");
  // Without both levels there is nothing to keep off the inter-node links: the compressed ring.
  if (comm.node_count() == 1 || comm.ranks_per_node() == 1)
    return allreduce_compressed_ring(comm, in, out, count, dtype, o, residual);
  const NodeGrid grid(comm);
  const std::size_t granule = o.kind == Compression::kQuantize ? o.block : 16;
  const std::size_t seg = compressed_segment_elements(o.pipeline, granule);
  const HierLayout layout(count, granule, grid.local_size(), grid.nodes(), seg);
  CodedInter inter(comm, layout, grid, out, out, dtype, o, residual, seg);
  const void* x = residual ? fold_residual(comm, layout, grid.local(), grid.local_size(), in, count, dtype, residual,
                                           static_cast<float*>(comm.scratch(2 * seg * sizeof(float), Scratch::kCodecFloats)),
                                           2 * seg)
                           : in;
  Hierarchical<CodedInter> schedule(grid, layout, x, out, dtype, ReduceOp::kSum, comm.size(), inter);
  run_pipeline(comm, schedule, o.pipeline, kTagHierarchical);
  // Each rank decoded its own shard's payloads: the node's ranks add their counts, so every rank
  // reports the count over every chunk, as the compressed ring does.
  NodeSum sum(grid, inter.nonfinite());
  run_pipeline(comm, sum, PipelineOptions{}, kTagHierarchical);
  return sum.total();
}

}  // namespace detail

void allreduce_hierarchical(Communicator& comm, const AllreduceArgs& a) {
  // One node: its shared memory when the transport offers it (the node-local stages alone).
  if (comm.node_count() == 1 && comm.has_shared_arena()) return allreduce_shm(comm, a);
  const void* in = a.in;
  void* out = a.out;
  const std::size_t count = a.count;
  const DType dtype = a.dtype;
  const ReduceOp op = a.op;
  const PipelineOptions& pipeline = a.pipeline;
  const detail::NodeGrid grid(comm);
  if (!grid.equal()) {
    detail::FoldExtras fold_in(grid, in, out, count, dtype, op, /*gather=*/true, pipeline);
    detail::run_pipeline(comm, fold_in, pipeline, detail::kTagHierarchical);
  }
  if (grid.core()) {
    const void* x = grid.extras().empty() ? in : out;  // this rank's input, its extras' folded in
    const detail::HierLayout layout(count, 1, grid.local_size(), grid.nodes(),
                                    detail::segment_elements(pipeline, dtype_size(dtype)));
    detail::DenseInter inter(layout, grid, grid.local_size() > 1 ? out : x, out, dtype, op, comm.size());
    detail::Hierarchical<detail::DenseInter> schedule(grid, layout, x, out, dtype, op, comm.size(), inter);
    detail::run_pipeline(comm, schedule, pipeline, detail::kTagHierarchical);
  }
  if (!grid.equal()) {
    detail::FoldExtras fold_out(grid, in, out, count, dtype, op, /*gather=*/false, pipeline);
    detail::run_pipeline(comm, fold_out, pipeline, detail::kTagHierarchical);
  }
}

double allreduce_hierarchical_cost(const CostQuery& q) {
  const double N = q.nodes, L = q.ranks / q.nodes, S = q.bytes;
  const double local = 2 * (L - 1) * q.alpha + 2 * (L - 1) / L * S * q.beta + (L - 1) / L * S * q.gamma;
  return local + 2 * (N - 1) * q.alpha + 2 * (N - 1) / N * S / L * q.beta + (N - 1) / N * S / L * q.gamma;
}

}  // namespace zcoll
