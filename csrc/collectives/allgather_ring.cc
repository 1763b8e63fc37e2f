// Ring allgather.
//
// Purpose: every rank ends with every rank's block, in rank order.
// Phases:  1. copy the local block into its place in `out` (skipped when in-place);
//          2. ring_allgather_phase: p-1 steps, each forwarding the block received last step,
//             received straight into `out` (no scratch, no copy).
// Cost:    (p-1) alpha + (p-1)/p S beta  (S = bytes of the gathered result).
#include <cstring>

#include "collectives/pipeline.h"
#include "collectives/ring.h"

namespace zcoll {
namespace detail {

namespace {

class RingAllgather {
 public:
  RingAllgather(Communicator& comm, void* buf, std::size_t count, DType dtype, int shift,
                const PipelineOptions& o)
      : buf_(static_cast<unsigned char*>(buf)), count_(count), es_(dtype_size(dtype)),
        rank_(comm.rank()), p_(comm.size()), shift_(shift),
        nseg_(num_segments(block_count(count, p_, 0), es_, o)) {}

  std::size_t num_units() const { return static_cast<std::size_t>(p_ - 1) * nseg_; }
  std::size_t max_segment_bytes() const {
    return ((block_count(count_, p_, 0) + nseg_ - 1) / nseg_) * es_;
  }

  Unit unit(std::size_t u) const {
    const int step = static_cast<int>(u / nseg_);
    const Range send = segment(mod(rank_ - step + shift_, p_), u % nseg_);
    const Range recv = segment(mod(rank_ - step - 1 + shift_, p_), u % nseg_);
    return Unit{buf_ + send.begin * es_, send.count * es_, mod(rank_ + 1, p_),
                buf_ + recv.begin * es_, recv.count * es_, mod(rank_ - 1, p_)};
  }
  void on_received(std::size_t, const void*) {}

 private:
  Range segment(int chunk, std::size_t j) const {
    return split(Range{block_begin(count_, p_, chunk), block_count(count_, p_, chunk)}, nseg_, j);
  }

  unsigned char* buf_;
  std::size_t count_;
  std::size_t es_;
  int rank_, p_, shift_;
  std::size_t nseg_;
};

}  // namespace

void ring_allgather_phase(Communicator& comm, void* buf, std::size_t count, DType dtype, int shift,
                          const PipelineOptions& pipeline) {
  RingAllgather schedule(comm, buf, count, dtype, shift, pipeline);
  run_pipeline(comm, schedule, schedule.num_units(), schedule.max_segment_bytes(), pipeline,
               kTagRingAllgather);
}

}  // namespace detail

void allgather_ring(Communicator& comm, const void* in, void* out, std::size_t count, DType dtype,
                    const PipelineOptions& pipeline) {
  const std::size_t bytes = count * dtype_size(dtype);
  auto* mine = static_cast<unsigned char*>(out) + static_cast<std::size_t>(comm.rank()) * bytes;
  if (in != mine && bytes) std::memmove(mine, in, bytes);
  detail::ring_allgather_phase(comm, out, count * comm.size(), dtype, /*shift=*/0, pipeline);
}

}  // namespace zcoll
