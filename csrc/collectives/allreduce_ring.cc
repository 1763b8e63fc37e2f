// Ring allreduce (reduce-scatter + allgather; Baidu / Horovod / NCCL ring), and the
// topology-ordered ring: the same schedule around the ring order the communicator's Topology
// chose from measured link bandwidths (comm/topology.h), so that the slowest links carry nothing.
//
// Purpose: bandwidth-optimal allreduce for large messages.
// Phases:  1. reduce-scatter steps 0 .. p-3 (shift 0): step 0 sends from `in`, every reduction
//             writes OP(incoming, in) into `out`, so out-of-place needs no initial copy;
//          2. per segment j: the last reduce-scatter step finishes segment j of the owned chunk
//             (position + 1; divided by p for avg), and the p-1 allgather steps of segment j follow at
//             once, while it is still in cache, instead of after every other segment.
//          Each chunk is reduced by one fixed sequence of ranks and then copied, so every rank
//          ends with the same bits.
// Cost:    2(p-1) alpha + 2(p-1)/p S beta + (p-1)/p S gamma, beta that of the ring's slowest hop.
#include "collectives/algorithms.h"
#include "collectives/ring.h"

namespace zcoll {
namespace {

class RingAllreduce : public detail::ScheduleBase {
 public:
  RingAllreduce(const detail::RingPlace& place, const void* in, void* out, std::size_t count, DType dtype,
                ReduceOp op, const PipelineOptions& o)
      : p_(place.size),
        rs_(place, in, out, final_chunk(place, out, count, dtype), count, dtype, op, /*shift=*/0, o),
        ag_(place, out, count, dtype, /*shift=*/1, o),
        nseg_(rs_.num_segments()) {}

  std::size_t num_units() const { return static_cast<std::size_t>(2 * p_ - 2) * nseg_; }
  std::size_t max_recv_bytes() const { return rs_.max_segment_bytes(); }

  detail::Unit unit(std::size_t u) const {
    const Where w = where(u);
    return w.reduce ? rs_.unit(w.step, w.seg) : ag_.unit(w.step, w.seg);
  }
  void on_received(std::size_t u, const detail::Slots& slots) {
    const Where w = where(u);
    if (w.reduce && slots.data[0]) rs_.on_received(w.step, w.seg, slots.data[0]);
  }

 private:
  struct Where {
    bool reduce;
    int step;
    std::size_t seg;
  };

  static void* final_chunk(const detail::RingPlace& place, void* out, std::size_t count, DType dtype) {
    const int owned = detail::mod(place.index + 1, place.size);
    return static_cast<unsigned char*>(out) + block_begin(count, place.size, owned) * dtype_size(dtype);
  }

  // Units 0 .. (p-2)*nseg-1: reduce-scatter steps 0..p-3, step-major. Then one block of p units
  // per segment: the last reduce-scatter step, then allgather steps 0..p-2.
  Where where(std::size_t u) const {
    const std::size_t head = static_cast<std::size_t>(p_ - 2) * nseg_;
    if (u < head) return {true, static_cast<int>(u / nseg_), u % nseg_};
    const std::size_t v = u - head, seg = v / p_;
    const int k = static_cast<int>(v % p_);
    return k == 0 ? Where{true, p_ - 2, seg} : Where{false, k - 1, seg};
  }

  int p_;
  detail::RingReduceScatterSteps rs_;
  detail::RingAllgatherSteps ag_;
  std::size_t nseg_;
};

}  // namespace

void allreduce_ring(Communicator& comm, const AllreduceArgs& a) {
  RingAllreduce schedule(detail::RingPlace::of(comm, a.order), a.in, a.out, a.count, a.dtype, a.op,
                         a.pipeline);
  detail::run_pipeline(comm, schedule, a.pipeline, detail::kTagRingReduceScatter);
}

double allreduce_ring_cost(const CostQuery& q) {
  const double p = q.ranks, S = q.bytes;
  return 2 * (p - 1) * q.alpha + 2 * (p - 1) / p * S * q.beta + (p - 1) / p * S * q.gamma;
}

}  // namespace zcoll
