// The two phases of a ring, shared by ring allreduce, reduce_scatter and allgather.
//
// The buffer of `count` elements is cut into p chunks (chunk c = block c of count, see
// block_begin/block_count); each chunk into nseg segments of at most max_segment_bytes.
// The rank at position k of the ring sends to position k+1 and receives from k-1; chunks are
// numbered by position. Positions are ranks (rank order) unless a RingPlace is built from an
// order (the topology-ordered ring). A (step, segment) pair is one pipeline unit.
#pragma once
#include <cstddef>
#include <vector>

#include "collectives/options.h"
#include "collectives/pipeline.h"
#include "comm/communicator.h"

namespace zcoll::detail {

// This rank's place on a ring: position `index` of `size`, sending to rank `next` and receiving
// from rank `prev`. In rank order without `order`; else order[k] sends to order[k+1].
struct RingPlace {
  int index = 0, size = 1, next = 0, prev = 0;
  static RingPlace of(const Communicator& comm, const std::vector<int>* order = nullptr);
};

// Where chunks and segments lie, and which chunk moves at which step; both phases share it.
class RingLayout {
 public:
  RingLayout(const RingPlace& place, std::size_t count, std::size_t elem_size, int shift,
             const PipelineOptions& o);
  std::size_t num_segments() const { return nseg_; }
  std::size_t max_segment_bytes() const;
  Range segment(int chunk, std::size_t j) const;  // in elements of the whole buffer
  int send_chunk(int step) const { return mod(index_ - step + shift_, p_); }
  int recv_chunk(int step) const { return mod(index_ - step - 1 + shift_, p_); }
  int next() const { return next_; }
  int prev() const { return prev_; }
  std::size_t elem_size() const { return es_; }
  int size() const { return p_; }

 private:
  std::size_t count_, es_;
  int index_, p_, shift_, next_, prev_;
  std::size_t nseg_;
};

// Reduce-scatter steps: at step s position k sends chunk (k - s + shift) and reduces the incoming
// chunk (k - s - 1 + shift) into it as OP(incoming, in). Partial results go to `partial` (a
// count-element buffer indexed like `in`; may be `out` itself), the chunk finished at the last
// step (chunk k + shift + 1) to `final_chunk`, divided by p for avg in the same pass.
// Cost: (p-1) steps, (p-1)/p * S bytes sent and reduced per rank.
class RingReduceScatterSteps {
 public:
  RingReduceScatterSteps(const RingPlace& place, const void* in, void* partial, void* final_chunk,
                         std::size_t count, DType dtype, ReduceOp op, int shift, const PipelineOptions& o);
  std::size_t num_segments() const { return layout_.num_segments(); }
  std::size_t max_segment_bytes() const { return layout_.max_segment_bytes(); }
  Unit unit(int step, std::size_t seg) const;
  void on_received(int step, std::size_t seg, const void* data);

 private:
  RingLayout layout_;
  const unsigned char* in_;
  unsigned char* partial_;
  unsigned char* final_;
  std::size_t count_;
  DType dtype_;
  ReduceOp op_;
};

// Allgather steps: position k starts with chunk (k + shift) of `buf`; at step s it sends chunk
// (k - s + shift) and receives chunk (k - s - 1 + shift) straight into `buf`.
// Cost: (p-1) steps, (p-1)/p * S bytes sent per rank.
class RingAllgatherSteps {
 public:
  RingAllgatherSteps(const RingPlace& place, void* buf, std::size_t count, DType dtype, int shift,
                     const PipelineOptions& o);
  std::size_t num_segments() const { return layout_.num_segments(); }
  std::size_t max_segment_bytes() const { return layout_.max_segment_bytes(); }
  Unit unit(int step, std::size_t seg) const;

 private:
  RingLayout layout_;
  unsigned char* buf_;
};

// The phases on their own, step after step (reduce_scatter and allgather collectives).
void ring_reduce_scatter_phase(Communicator& comm, const void* in, void* partial, void* final_chunk,
                               std::size_t count, DType dtype, ReduceOp op, int shift,
                               const PipelineOptions& pipeline);
void ring_allgather_phase(Communicator& comm, void* buf, std::size_t count, DType dtype, int shift,
                          const PipelineOptions& pipeline, Tag tag = kTagRingAllgather);

}  // namespace zcoll::detail
