// Ring reduce-scatter.
//
// Purpose: every rank ends with its block (block_begin/block_count) of the reduction.
// Phases:  1. ring_reduce_scatter_phase with shift -1, so rank r ends with chunk r; partial
//             sums live in a scratch buffer, the last step writes straight into `out`.
// Cost:    (p-1) alpha + (p-1)/p S beta + (p-1)/p S gamma  (S = bytes of the whole input).
#include "collectives/pipeline.h"
#include "collectives/ring.h"
#include "kernels/reduce.h"

namespace zcoll {
namespace detail {

namespace {

class RingReduceScatter {
 public:
  RingReduceScatter(Communicator& comm, const void* in, void* partial, void* final_chunk,
                    std::size_t count, DType dtype, ReduceOp op, int shift, const PipelineOptions& o)
      : in_(static_cast<const unsigned char*>(in)),
        partial_(static_cast<unsigned char*>(partial)),
        final_(static_cast<unsigned char*>(final_chunk)),
        count_(count), dtype_(dtype), op_(op), es_(dtype_size(dtype)),
        rank_(comm.rank()), p_(comm.size()), shift_(shift),
        nseg_(num_segments(block_count(count, p_, 0), es_, o)) {}

  std::size_t num_units() const { return static_cast<std::size_t>(p_ - 1) * nseg_; }
  std::size_t max_segment_bytes() const {
    return ((block_count(count_, p_, 0) + nseg_ - 1) / nseg_) * es_;
  }

  Unit unit(std::size_t u) const {
    const int step = static_cast<int>(u / nseg_);
    const Range send = segment(send_chunk(step), u % nseg_);
    const Range recv = segment(recv_chunk(step), u % nseg_);
    const unsigned char* send_base = step == 0 ? in_ : partial_;
    return Unit{send_base + send.begin * es_, send.count * es_, mod(rank_ + 1, p_),
                nullptr,                      recv.count * es_, mod(rank_ - 1, p_)};
  }

  void on_received(std::size_t u, const void* data) {
    const int step = static_cast<int>(u / nseg_);
    const int chunk = recv_chunk(step);
    const Range seg = segment(chunk, u % nseg_);
    const bool last = step == p_ - 2;
    unsigned char* dst = last ? final_ + (seg.begin - block_begin(count_, p_, chunk)) * es_
                              : partial_ + seg.begin * es_;
    kernels::reduce(dst, data, in_ + seg.begin * es_, seg.count, dtype_, op_);
    if (last && op_ == ReduceOp::kAvg) kernels::divide(dst, seg.count, dtype_, p_);
  }

 private:
  int send_chunk(int step) const { return mod(rank_ - step + shift_, p_); }
  int recv_chunk(int step) const { return mod(rank_ - step - 1 + shift_, p_); }
  Range segment(int chunk, std::size_t j) const {
    const Range c{block_begin(count_, p_, chunk), block_count(count_, p_, chunk)};
    return split(c, nseg_, j);
  }

  const unsigned char* in_;
  unsigned char* partial_;
  unsigned char* final_;
  std::size_t count_;
  DType dtype_;
  ReduceOp op_;
  std::size_t es_;
  int rank_, p_, shift_;
  std::size_t nseg_;
};

}  // namespace

void ring_reduce_scatter_phase(Communicator& comm, const void* in, void* partial, void* final_chunk,
                               std::size_t count, DType dtype, ReduceOp op, int shift,
                               const PipelineOptions& pipeline) {
  RingReduceScatter schedule(comm, in, partial, final_chunk, count, dtype, op, shift, pipeline);
  run_pipeline(comm, schedule, schedule.num_units(), schedule.max_segment_bytes(), pipeline,
               kTagRingReduceScatter);
}

}  // namespace detail

void reduce_scatter_ring(Communicator& comm, const void* in, void* out, std::size_t count,
                         DType dtype, ReduceOp op, const PipelineOptions& pipeline) {
  // Partial sums of the chunks other ranks finish; slot 1 (slot 0 holds the pipeline's slots).
  void* partial = comm.scratch(count * dtype_size(dtype), /*slot=*/1);
  detail::ring_reduce_scatter_phase(comm, in, partial, out, count, dtype, op, /*shift=*/-1, pipeline);
}

}  // namespace zcoll
