// Ring allgather of variable-size byte blocks, in place (the sparse allreduce's pair exchange).
//
// Phases: p-1 steps; at step s rank r sends block r-s and receives block r-s-1 straight into
//         its place. Every block is cut into the same number of segments (enough that the
//         largest block's segments fit max_segment_bytes); a (step, segment) pair is one
//         pipeline unit, and empty segments are skipped by both sides alike.
// Cost:   (p-1) alpha + (SUM of bytes - bytes[r+1]) beta per rank; no scratch, no copies.
#include <algorithm>

#include "collectives/compressed.h"
#include "collectives/pipeline.h"

namespace zcoll::detail {
namespace {

class AllgathervSteps : public ScheduleBase {
 public:
  AllgathervSteps(Communicator& comm, void* buf, const std::size_t* offset, const std::size_t* bytes,
                  std::size_t nseg)
      : buf_(static_cast<unsigned char*>(buf)),
        offset_(offset),
        bytes_(bytes),
        rank_(comm.rank()),
        p_(comm.size()),
        nseg_(nseg) {}

  std::size_t num_units() const { return static_cast<std::size_t>(p_ - 1) * nseg_; }
  std::size_t max_recv_bytes() const { return 0; }
  Unit unit(std::size_t u) const {
    const int step = static_cast<int>(u / nseg_);
    const Range send = part(mod(rank_ - step, p_), u % nseg_);
    const Range recv = part(mod(rank_ - step - 1, p_), u % nseg_);
    return Unit::exchange(buf_ + send.begin, send.count, mod(rank_ + 1, p_), buf_ + recv.begin, recv.count,
                          mod(rank_ - 1, p_));
  }

 private:
  Range part(int block, std::size_t j) const { return split(Range{offset_[block], bytes_[block]}, nseg_, j); }

  unsigned char* buf_;
  const std::size_t* offset_;
  const std::size_t* bytes_;
  int rank_, p_;
  std::size_t nseg_;
};

}  // namespace

void ring_allgatherv(Communicator& comm, void* buf, const std::size_t* offset, const std::size_t* bytes,
                     const PipelineOptions& pipeline) {
  const int p = comm.size();
  if (p == 1) return;
  const std::size_t largest = *std::max_element(bytes, bytes + p);
  if (largest == 0) return;
  const std::size_t nseg = num_segments(largest, 1, pipeline);
  AllgathervSteps steps(comm, buf, offset, bytes, nseg);
  run_pipeline(comm, steps, pipeline, kTagRingAllgather);
}

}  // namespace zcoll::detail
