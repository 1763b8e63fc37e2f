#include "collectives/ring.h"

#include <algorithm>

#include "common/check.h"
#include "kernels/reduce.h"

namespace zcoll::detail {

RingPlace RingPlace::of(const Communicator& comm, const std::vector<int>* order) {
  const int p = comm.size(), me = comm.rank();
  if (!order || order->empty()) return RingPlace{me, p, mod(me + 1, p), mod(me - 1, p)};
  ZCOLL_CHECK_EQ(order->size(), static_cast<std::size_t>(p), "ring order length");
  const auto at = std::find(order->begin(), order->end(), me);
  ZCOLL_CHECK_LT(at - order->begin(), p, "this rank in the ring order");
  const int k = static_cast<int>(at - order->begin());
  return RingPlace{k, p, (*order)[mod(k + 1, p)], (*order)[mod(k - 1, p)]};
}

RingLayout::RingLayout(const RingPlace& place, std::size_t count, std::size_t elem_size, int shift,
                       const PipelineOptions& o)
    : count_(count), es_(elem_size), index_(place.index), p_(place.size), shift_(shift), next_(place.next),
      prev_(place.prev), nseg_(detail::num_segments(block_count(count, p_, 0), es_, o)) {}

std::size_t RingLayout::max_segment_bytes() const {
  return ((block_count(count_, p_, 0) + nseg_ - 1) / nseg_) * es_;
}

Range RingLayout::segment(int chunk, std::size_t j) const {
  return split(Range{block_begin(count_, p_, chunk), block_count(count_, p_, chunk)}, nseg_, j);
}

RingReduceScatterSteps::RingReduceScatterSteps(const RingPlace& place, const void* in, void* partial,
                                               void* final_chunk, std::size_t count, DType dtype,
                                               ReduceOp op, int shift, const PipelineOptions& o)
    : layout_(place, count, dtype_size(dtype), shift, o),
      in_(static_cast<const unsigned char*>(in)),
      partial_(static_cast<unsigned char*>(partial)),
      final_(static_cast<unsigned char*>(final_chunk)),
      count_(count), dtype_(dtype), op_(op) {}

Unit RingReduceScatterSteps::unit(int step, std::size_t seg) const {
  const std::size_t es = layout_.elem_size();
  const Range send = layout_.segment(layout_.send_chunk(step), seg);
  const Range recv = layout_.segment(layout_.recv_chunk(step), seg);
  const unsigned char* send_base = step == 0 ? in_ : partial_;
  return Unit::exchange(send_base + send.begin * es, send.count * es, layout_.next(), nullptr, recv.count * es,
                        layout_.prev());
}

void RingReduceScatterSteps::on_received(int step, std::size_t seg_index, const void* data) {
  const std::size_t es = layout_.elem_size();
  const int p = layout_.size();
  const int chunk = layout_.recv_chunk(step);
  const Range seg = layout_.segment(chunk, seg_index);
  const bool last = step == p - 2;
  unsigned char* dst = last ? final_ + (seg.begin - block_begin(count_, p, chunk)) * es
                            : partial_ + seg.begin * es;
  kernels::reduce(dst, data, in_ + seg.begin * es, seg.count, dtype_, op_);
  if (last && op_ == ReduceOp::kAvg) kernels::divide(dst, seg.count, dtype_, p);
}

RingAllgatherSteps::RingAllgatherSteps(const RingPlace& place, void* buf, std::size_t count, DType dtype,
                                       int shift, const PipelineOptions& o)
    : layout_(place, count, dtype_size(dtype), shift, o), buf_(static_cast<unsigned char*>(buf)) {}

Unit RingAllgatherSteps::unit(int step, std::size_t seg) const {
  const std::size_t es = layout_.elem_size();
  const Range send = layout_.segment(layout_.send_chunk(step), seg);
  const Range recv = layout_.segment(layout_.recv_chunk(step), seg);
  return Unit::exchange(buf_ + send.begin * es, send.count * es, layout_.next(), buf_ + recv.begin * es,
                        recv.count * es, layout_.prev());
}

namespace {

// Step-major order: all segments of step 0, then of step 1, ...
template <typename Steps, bool kReduces>
struct StepMajor : ScheduleBase {
  Steps& steps;
  std::size_t nseg, steps_count;
  StepMajor(Steps& s, int p) : steps(s), nseg(s.num_segments()), steps_count(static_cast<std::size_t>(p - 1)) {}
  std::size_t num_units() const { return steps_count * nseg; }
  std::size_t max_recv_bytes() const { return kReduces ? steps.max_segment_bytes() : 0; }
  Unit unit(std::size_t u) const { return steps.unit(static_cast<int>(u / nseg), u % nseg); }
  void on_received(std::size_t u, const Slots& slots) {
    if constexpr (kReduces)
      if (slots.data[0]) steps.on_received(static_cast<int>(u / nseg), u % nseg, slots.data[0]);
  }
};

}  // namespace

void ring_reduce_scatter_phase(Communicator& comm, const void* in, void* partial, void* final_chunk,
                               std::size_t count, DType dtype, ReduceOp op, int shift,
                               const PipelineOptions& pipeline) {
  RingReduceScatterSteps steps(RingPlace::of(comm), in, partial, final_chunk, count, dtype, op, shift, pipeline);
  StepMajor<RingReduceScatterSteps, true> schedule(steps, comm.size());
  run_pipeline(comm, schedule, pipeline, kTagRingReduceScatter);
}

void ring_allgather_phase(Communicator& comm, void* buf, std::size_t count, DType dtype, int shift,
                          const PipelineOptions& pipeline, Tag tag) {
  RingAllgatherSteps steps(RingPlace::of(comm), buf, count, dtype, shift, pipeline);
  StepMajor<RingAllgatherSteps, false> schedule(steps, comm.size());
  run_pipeline(comm, schedule, pipeline, tag);
}

}  // namespace zcoll::detail
