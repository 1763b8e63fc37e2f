#include "collectives/ring.h"

#include "kernels/reduce.h"

namespace zcoll::detail {

RingReduceScatterSteps::RingReduceScatterSteps(Communicator& comm, const void* in, void* partial,
                                               void* final_chunk, std::size_t count, DType dtype,
                                               ReduceOp op, int shift, const PipelineOptions& o)
    : in_(static_cast<const unsigned char*>(in)),
      partial_(static_cast<unsigned char*>(partial)),
      final_(static_cast<unsigned char*>(final_chunk)),
      count_(count), dtype_(dtype), op_(op), es_(dtype_size(dtype)),
      rank_(comm.rank()), p_(comm.size()), shift_(shift),
      nseg_(detail::num_segments(block_count(count, p_, 0), es_, o)) {}

std::size_t RingReduceScatterSteps::max_segment_bytes() const {
  return ((block_count(count_, p_, 0) + nseg_ - 1) / nseg_) * es_;
}

Range RingReduceScatterSteps::segment(int chunk, std::size_t j) const {
  return split(Range{block_begin(count_, p_, chunk), block_count(count_, p_, chunk)}, nseg_, j);
}

Unit RingReduceScatterSteps::unit(int step, std::size_t seg) const {
  const Range send = segment(mod(rank_ - step + shift_, p_), seg);
  const Range recv = segment(mod(rank_ - step - 1 + shift_, p_), seg);
  const unsigned char* send_base = step == 0 ? in_ : partial_;
  return Unit{send_base + send.begin * es_, send.count * es_, mod(rank_ + 1, p_),
              nullptr,                      recv.count * es_, mod(rank_ - 1, p_)};
}

void RingReduceScatterSteps::on_received(int step, std::size_t seg_index, const void* data) {
  const int chunk = mod(rank_ - step - 1 + shift_, p_);
  const Range seg = segment(chunk, seg_index);
  const bool last = step == p_ - 2;
  unsigned char* dst = last ? final_ + (seg.begin - block_begin(count_, p_, chunk)) * es_
                            : partial_ + seg.begin * es_;
  kernels::reduce(dst, data, in_ + seg.begin * es_, seg.count, dtype_, op_);
  if (last && op_ == ReduceOp::kAvg) kernels::divide(dst, seg.count, dtype_, p_);
}

RingAllgatherSteps::RingAllgatherSteps(Communicator& comm, void* buf, std::size_t count, DType dtype,
                                       int shift, const PipelineOptions& o)
    : buf_(static_cast<unsigned char*>(buf)), count_(count), es_(dtype_size(dtype)),
      rank_(comm.rank()), p_(comm.size()), shift_(shift),
      nseg_(detail::num_segments(block_count(count, p_, 0), es_, o)) {}

std::size_t RingAllgatherSteps::max_segment_bytes() const {
  return ((block_count(count_, p_, 0) + nseg_ - 1) / nseg_) * es_;
}

Range RingAllgatherSteps::segment(int chunk, std::size_t j) const {
  return split(Range{block_begin(count_, p_, chunk), block_count(count_, p_, chunk)}, nseg_, j);
}

Unit RingAllgatherSteps::unit(int step, std::size_t seg) const {
  const Range send = segment(mod(rank_ - step + shift_, p_), seg);
  const Range recv = segment(mod(rank_ - step - 1 + shift_, p_), seg);
  return Unit{buf_ + send.begin * es_, send.count * es_, mod(rank_ + 1, p_),
              buf_ + recv.begin * es_, recv.count * es_, mod(rank_ - 1, p_)};
}

namespace {

// Step-major order: all segments of step 0, then of step 1, ...
template <typename Steps, bool kReduces>
struct StepMajor {
  Steps& steps;
  std::size_t nseg;
  Unit unit(std::size_t u) const { return steps.unit(static_cast<int>(u / nseg), u % nseg); }
  void on_received(std::size_t u, const void* data) {
    if constexpr (kReduces) steps.on_received(static_cast<int>(u / nseg), u % nseg, data);
  }
};

}  // namespace

void ring_reduce_scatter_phase(Communicator& comm, const void* in, void* partial, void* final_chunk,
                               std::size_t count, DType dtype, ReduceOp op, int shift,
                               const PipelineOptions& pipeline) {
  RingReduceScatterSteps steps(comm, in, partial, final_chunk, count, dtype, op, shift, pipeline);
  StepMajor<RingReduceScatterSteps, true> schedule{steps, steps.num_segments()};
  run_pipeline(comm, schedule, static_cast<std::size_t>(comm.size() - 1) * steps.num_segments(),
               steps.max_segment_bytes(), pipeline, kTagRingReduceScatter);
}

void ring_allgather_phase(Communicator& comm, void* buf, std::size_t count, DType dtype, int shift,
                          const PipelineOptions& pipeline) {
  RingAllgatherSteps steps(comm, buf, count, dtype, shift, pipeline);
  StepMajor<RingAllgatherSteps, false> schedule{steps, steps.num_segments()};
  run_pipeline(comm, schedule, static_cast<std::size_t>(comm.size() - 1) * steps.num_segments(),
               steps.max_segment_bytes(), pipeline, kTagRingAllgather);
}

}  // namespace zcoll::detail
